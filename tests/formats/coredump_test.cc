// The CUDA core dump reader (formats/coredump) over dumps built here from
// the public format description (coredump_test_util.h), independently of
// the reader: every table present, rows of older and newer drivers,
// sections missing, truncation at every section boundary, indices and
// links that point outside, two faulting warps, a fault with no valid PC.
// Each dump is read correctly or refused with a message naming the section.
//
// The fuzz seeds in fuzz/corpus/coredump/ are written by these builders; to
// regenerate them after a deliberate change:
//   export CRASHREPLAY_SOURCE_DIR=$PWD CRASHREPLAY_REGENERATE_COREDUMPS=1
//   build/tests/formats_test --gtest_filter='Coredump.FuzzSeeds*'
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coredump_test_util.h"
#include "crashreplay/formats/coredump/coredump.h"

namespace crashreplay::coredump {
namespace {

using coredump_testing::BuildDump;
using coredump_testing::BuiltDump;
using coredump_testing::Bytes;
using coredump_testing::DumpModel;
using coredump_testing::ElfWriter;
using coredump_testing::kFaultOffset;
using coredump_testing::kKernelAddress;
using coredump_testing::kKernelDemangled;
using coredump_testing::kKernelName;
using coredump_testing::OneFault;
using ::testing::HasSubstr;

absl::StatusOr<Coredump> Read(const Bytes& b) {
  return ReadCoredump(std::span<const std::byte>(reinterpret_cast<const std::byte*>(b.data()), b.size()), "test.dump");
}

void Put32(Bytes& b, uint64_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}
void Put64(Bytes& b, uint64_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<unsigned char>(v >> (8 * i));
}

// The section-header field of the named section.
uint64_t Field(const BuiltDump& d, const std::string& section, uint64_t field) {
  return ElfWriter::HeaderField(d.index.at(section), field);
}

constexpr const char* kBadWarpTable = ".cudbg.wptbl.dev1.sm1.cta0";
constexpr const char* kBadLaneTable = ".cudbg.lntbl.dev1.sm1.cta0.wp1";

// ---- reading ------------------------------------------------------------------

TEST(Coredump, ReadsEveryTableOfALightweightDump) {
  const BuiltDump built = BuildDump(OneFault());
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();

  ASSERT_EQ(dump->devices.size(), 2u);
  EXPECT_EQ(dump->devices[1].id, 3u);
  EXPECT_EQ(dump->devices[1].index, 1u);
  EXPECT_EQ(dump->devices[1].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(dump->devices[1].sm_type, "sm_90");
  EXPECT_EQ(dump->devices[1].num_sms, 132u);

  ASSERT_TRUE(dump->meta.has_value());
  EXPECT_EQ(dump->meta->generator, "cuda-coredump");
  EXPECT_EQ(dump->meta->driver_major, 575u);
  EXPECT_EQ(dump->meta->driver_minor, 57u);
  EXPECT_EQ(dump->meta->cuda_major, 12u);
  EXPECT_EQ(dump->meta->cuda_minor, 9u);
  EXPECT_EQ(dump->meta->flags, 0x2fu);
  EXPECT_EQ(dump->left_out, (std::vector<std::string>{"global memory", "shared memory", "local memory",
                                                      "constant bank memory", "unrelocated module images"}));

  ASSERT_EQ(dump->faults.size(), 1u);
  const Fault& f = dump->faults[0];
  EXPECT_EQ(f.device_id, 3u);
  EXPECT_EQ(f.device_index, 1u);
  EXPECT_EQ(f.sm, 12u);
  EXPECT_EQ(f.warp, 5u);
  EXPECT_EQ(f.exception, 12u);
  EXPECT_EQ(ExceptionName(f.exception), "warp assert");
  EXPECT_EQ(f.error_pc, kKernelAddress + kFaultOffset);
  EXPECT_EQ(f.pc_source, PcSource::kWarp);
  ASSERT_TRUE(f.lanes_read);
  ASSERT_EQ(f.lanes.size(), 4u);  // lanes 4 and 5 run on clean
  EXPECT_EQ(f.lanes[0].lane, 0u);
  EXPECT_EQ(f.lanes[0].thread, (Dim3{64, 0, 0}));
  EXPECT_EQ(f.lanes[3].thread, (Dim3{67, 0, 0}));
  EXPECT_EQ(f.block, (Dim3{12, 0, 0}));
  EXPECT_EQ(f.grid_id, 7u);

  const Location* loc = dump->LocationOf(f);
  ASSERT_NE(loc, nullptr);
  ASSERT_TRUE(loc->function.has_value()) << loc->why_unknown;
  EXPECT_EQ(loc->function->name, kKernelName);
  EXPECT_EQ(loc->function->demangled, kKernelDemangled);
  EXPECT_EQ(loc->function->start, kKernelAddress);
  EXPECT_EQ(loc->function->offset, kFaultOffset);
  EXPECT_EQ(loc->function->module_handle, 0xabc000u);

  const Grid* g = dump->GridOf(f);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->grid_dim, (Dim3{128, 1, 1}));
  EXPECT_EQ(g->block_dim, (Dim3{256, 1, 1}));
  EXPECT_EQ(g->function_entry, kKernelAddress);
  EXPECT_EQ(g->cluster_dim, (Dim3{1, 1, 1}));

  EXPECT_EQ(dump->contents.devices, 2u);
  EXPECT_EQ(dump->contents.sms, 2u);
  EXPECT_EQ(dump->contents.warps, 2u);
  EXPECT_EQ(dump->contents.lanes, 10u);
  EXPECT_EQ(dump->contents.relocated_images, 2u);
  EXPECT_EQ(dump->contents.registers, 10u);
  EXPECT_EQ(dump->contents.backtraces, 10u);
  EXPECT_EQ(dump->contents.global_memory, 0u);
  EXPECT_TRUE(dump->notes.empty()) << dump->notes[0];
}

TEST(Coredump, SummaryNamesTheFaultTheVersionsAndWhatIsLeftOut) {
  absl::StatusOr<Coredump> dump = Read(BuildDump(OneFault()).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  const std::vector<std::string> lines = SummaryLines(*dump);
  ASSERT_GE(lines.size(), 5u);
  EXPECT_EQ(lines[0],
            "device 3 SM 12 warp 5 lane 0: warp assert in `void flash_attn_fwd<float>(float*, int)` +0x1a40, "
            "block (12,0,0) thread (64,0,0), grid 7 dims (128,1,1)(256,1,1); 4 lanes faulted (mask 0xf)");
  EXPECT_THAT(lines[1], HasSubstr("driver 575.57, CUDA 12.9"));
  EXPECT_THAT(lines[1], HasSubstr("'cuda-coredump' at 2025-06-15T15:06:40Z"));
  EXPECT_THAT(lines,
              ::testing::Contains("left out by the generation flags 0x2f: global memory, shared memory, local memory, "
                                  "constant bank memory, unrelocated module images"));
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("the dump holds no memory")));
}

TEST(Coredump, RowsLongerThanThisReaderKnowsAreReadByTheirEntrySize) {
  // A newer driver's rows: 24 bytes more each, filled with 0xEE.
  DumpModel m = OneFault();
  m.extra_row_bytes = 24;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  absl::StatusOr<Coredump> plain = Read(BuildDump(OneFault()).bytes);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(SummaryLines(*dump)[0], SummaryLines(*plain)[0]);
  ASSERT_EQ(dump->faults.size(), 1u);
  EXPECT_EQ(dump->faults[0].lanes.size(), 4u);
  EXPECT_EQ(dump->devices[1].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(dump->meta->flags, 0x2fu);
  EXPECT_THAT(dump->notes, ::testing::Contains(HasSubstr("warp table rows are 88 bytes; this reader knows their first "
                                                         "64")));
}

TEST(Coredump, TheFirstDriversRowsReadWithLaterFieldsAbsent) {
  DumpModel m = OneFault();
  m.driver = 346;
  m.meta.reset();  // metadata came with r565
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->faults.size(), 1u);
  EXPECT_EQ(dump->faults[0].exception, 12u);
  ASSERT_NE(dump->GridOf(dump->faults[0]), nullptr);
  EXPECT_FALSE(dump->GridOf(dump->faults[0])->cluster_dim.has_value());
  EXPECT_FALSE(dump->meta.has_value());
  EXPECT_TRUE(dump->left_out.empty());
  EXPECT_THAT(dump->notes, ::testing::Contains(HasSubstr("SM rows are 8 bytes (a driver before r555)")));
  EXPECT_THAT(dump->notes, ::testing::Contains(HasSubstr("no metadata section")));
  EXPECT_THAT(SummaryLines(*dump), ::testing::Contains(HasSubstr("versions: not recorded")));
}

TEST(Coredump, TwoFaultingWarpsAreBothReportedInTableOrder) {
  DumpModel m = OneFault();
  coredump_testing::WarpModel other;
  other.id = 9;
  other.error_pc_valid = true;
  other.error_pc = kKernelAddress + 0x8000 + 0x30;  // in reduce2
  other.lanes = {{7, 200, 1, 0, /*warp illegal address*/ 14, other.error_pc, 0x30}};
  coredump_testing::CtaModel cta;
  cta.grid_id = 7;
  cta.bx = 3;
  cta.by = 1;
  cta.warps = {other};
  coredump_testing::SmModel sm;
  sm.id = 40;
  sm.ctas = {cta};
  m.devices[1].sms.push_back(sm);
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->faults.size(), 2u);
  EXPECT_EQ(dump->faults[0].sm, 12u);
  EXPECT_EQ(dump->faults[1].sm, 40u);
  EXPECT_EQ(dump->faults[1].warp, 9u);
  EXPECT_EQ(ExceptionName(dump->faults[1].exception), "warp illegal address");
  EXPECT_EQ(dump->faults[1].block, (Dim3{3, 1, 0}));
  const Location* loc = dump->LocationOf(dump->faults[1]);
  ASSERT_TRUE(loc->function.has_value()) << loc->why_unknown;
  EXPECT_EQ(loc->function->demangled, "reduce2(float*, int)");
  EXPECT_EQ(loc->function->offset, 0x30u);
  EXPECT_EQ(SummaryLines(*dump)[1],
            "device 3 SM 40 warp 9 lane 7: warp illegal address in `reduce2(float*, int)` +0x30, block (3,1,0) "
            "thread (200,1,0), grid 7 dims (128,1,1)(256,1,1)");
}

TEST(Coredump, AFaultWithNoValidErrorPcIsLocatedByItsLaneAndSaysSo) {
  DumpModel m = OneFault();
  m.devices[1].sms[1].ctas[0].warps[1].error_pc_valid = false;
  m.devices[1].sms[1].error_pc_valid = false;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->faults.size(), 1u);
  const Fault& f = dump->faults[0];
  EXPECT_FALSE(f.error_pc.has_value());
  EXPECT_EQ(f.pc_source, PcSource::kLane);
  ASSERT_TRUE(dump->LocationOf(f)->function.has_value());
  EXPECT_EQ(dump->LocationOf(f)->function->offset, kFaultOffset);
  EXPECT_THAT(SummaryLines(*dump)[0], HasSubstr("warp assert, error PC not valid in the dump; lane 0's PC is in "
                                                "`void flash_attn_fwd<float>(float*, int)` +0x1a40"));
}

TEST(Coredump, AWarpWithNoPcAndNoLaneExceptionIsNotAFault) {
  DumpModel m = OneFault();
  auto& bad = m.devices[1].sms[1].ctas[0].warps[1];
  bad.error_pc_valid = false;
  for (auto& l : bad.lanes) l.exception = 0;
  m.devices[1].sms[1].exception = 0;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_TRUE(dump->faults.empty());
  EXPECT_EQ(SummaryLines(*dump)[0], "no faulting warp or SM in this dump");
}

TEST(Coredump, AnSmWhoseFaultingWarpsExitedIsReportedAtTheSmLevel) {
  DumpModel m = OneFault();
  auto& sm = m.devices[1].sms[1];
  sm.ctas.clear();
  sm.exception = 14;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->faults.size(), 1u);
  EXPECT_FALSE(dump->faults[0].warp.has_value());
  EXPECT_EQ(dump->faults[0].pc_source, PcSource::kSm);
  EXPECT_EQ(SummaryLines(*dump)[0],
            "device 3 SM 12: warp illegal address reported by the SM; no warp in the dump carries it (its warps "
            "exited), error PC in `void flash_attn_fwd<float>(float*, int)` +0x1a40");
}

TEST(Coredump, ExtendedSectionNumberingIsRead) {
  DumpModel m = OneFault();
  m.extended_numbering = true;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  absl::StatusOr<Coredump> plain = Read(BuildDump(OneFault()).bytes);
  EXPECT_EQ(SummaryLines(*dump), SummaryLines(*plain));
}

// ---- sections missing ---------------------------------------------------------

TEST(Coredump, WithoutGridTablesTheGridIsSaidToBeMissing) {
  DumpModel m = OneFault();
  m.grid_tables = false;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->faults.size(), 1u);
  EXPECT_EQ(dump->GridOf(dump->faults[0]), nullptr);
  // Without the grid's module the function is still found among the device's images.
  EXPECT_TRUE(dump->LocationOf(dump->faults[0])->function.has_value());
  EXPECT_THAT(SummaryLines(*dump)[0], HasSubstr("grid 7 (not in the dump's grid tables)"));
}

TEST(Coredump, WithoutTheModuleImageTheFunctionIsUnknownAndSaysWhy) {
  DumpModel m = OneFault();
  for (auto& mod : m.devices[1].modules) mod.image = false;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  const Location* loc = dump->LocationOf(dump->faults[0]);
  EXPECT_FALSE(loc->function.has_value());
  EXPECT_EQ(loc->why_unknown, "the dump holds no relocated module image for device row 1");
  EXPECT_THAT(SummaryLines(*dump)[0],
              HasSubstr("warp assert at 0x7f3a00001a40 (function unknown: the dump holds no relocated module image"));
}

TEST(Coredump, APcNoFunctionCoversIsUnknown) {
  DumpModel m = OneFault();
  m.devices[1].sms[1].ctas[0].warps[1].error_pc = 0x1000;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(dump->LocationOf(dump->faults[0])->why_unknown,
            "no function symbol in the 2 relocated module images of device row 1 covers 0x1000");
}

TEST(Coredump, WithoutALaneTableTheWarpFaultKeepsItsPcAndTheSmsException) {
  DumpModel m = OneFault();
  m.devices[1].sms[1].ctas[0].warps[1].lane_table = false;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  ASSERT_EQ(dump->faults.size(), 1u);
  const Fault& f = dump->faults[0];
  EXPECT_FALSE(f.lanes_read);
  EXPECT_EQ(f.exception, 12u);  // from the SM row (r555)
  EXPECT_EQ(f.error_pc, kKernelAddress + kFaultOffset);
  EXPECT_THAT(SummaryLines(*dump)[0], HasSubstr("device 3 SM 12 warp 5: warp assert in"));
  EXPECT_THAT(SummaryLines(*dump)[0], HasSubstr("the dump has no lane table for this warp"));
}

TEST(Coredump, WithoutSmTablesThereIsNoFault) {
  DumpModel m = OneFault();
  m.sm_tables = false;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_TRUE(dump->faults.empty());
}

TEST(Coredump, WithoutADeviceTableTheDumpIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put32(built.bytes, Field(built, ".cudbg.devtbl", 4), /*SHT_PROGBITS*/ 1);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(), HasSubstr("test.dump: no device table"));
}

TEST(Coredump, WithoutAStringTableTheDeviceNamesCannotBeReadAndTheDumpIsRefused) {
  DumpModel m = OneFault();
  m.strtab = false;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(), HasSubstr("'.cudbg.devtbl' row 0"));
  EXPECT_THAT(dump.status().message(), HasSubstr("the device name is string"));
  EXPECT_THAT(dump.status().message(), HasSubstr("but the dump has no .strtab section"));
}

// ---- row sizes ----------------------------------------------------------------

TEST(Coredump, RowsShorterThanTheFirstLayoutAreRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put64(built.bytes, Field(built, kBadWarpTable, coredump_testing::kShEntsize), 16);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(),
              HasSubstr("'.cudbg.wptbl.dev1.sm1.cta0' (warp table): rows of 16 bytes (sh_entsize), shorter than the "
                        "32 bytes of the first driver's warp table rows"));
}

TEST(Coredump, ARowSizeOfZeroIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put64(built.bytes, Field(built, kBadLaneTable, coredump_testing::kShEntsize), 0);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(), HasSubstr("rows of 0 bytes (sh_entsize)"));
}

TEST(Coredump, ATableThatIsNotAWholeNumberOfRowsIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put64(built.bytes, Field(built, kBadLaneTable, coredump_testing::kShEntsize), 60);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(), HasSubstr("'.cudbg.lntbl.dev1.sm1.cta0.wp1' (lane table): its 336 bytes are "
                                                 "not a whole number of 60-byte rows"));
}

// ---- indices and links that point outside ---------------------------------------

TEST(Coredump, AStringIndexPastTheStringTableIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  const uint64_t row1 = built.layout.data_at[built.index.at(".cudbg.devtbl")] + 88;  // r575 device rows
  Put64(built.bytes, row1, 99999);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(),
              HasSubstr(absl::StrFormat("'.cudbg.devtbl' row 1 (file offset %d): the device name is string 99999 of "
                                        ".strtab: index 99999 is past the end of the",
                                        row1)));
}

TEST(Coredump, AStringWithoutItsTerminatingNulIsRefused) {
  DumpModel m = OneFault();
  m.meta->generator = "gen";
  BuiltDump built = BuildDump(m);
  // The generator is the last string added: point it at the table's final byte
  // after overwriting that NUL.
  const uint32_t strtab = built.index.at(".strtab");
  const uint64_t end = built.layout.data_at[strtab] + built.layout.data_size[strtab];
  built.bytes[end - 1] = 'x';
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(), HasSubstr("has no terminating NUL before the table ends"));
}

TEST(Coredump, ASectionNameIndexPastTheNameTableIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put32(built.bytes, Field(built, kBadWarpTable, coredump_testing::kShName), 70000);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(),
              HasSubstr(absl::StrFormat("section %d (type 0x8000000e): its name (sh_name 70000) cannot be read",
                                        built.index.at(kBadWarpTable))));
}

TEST(Coredump, AnShLinkPastTheLastSectionIsRefusedEvenOnASectionNotRead) {
  BuiltDump built = BuildDump(OneFault());
  const std::string regs = ".cudbg.regs.dev1.sm1.cta0.wp1.ln0";
  Put32(built.bytes, Field(built, regs, coredump_testing::kShLink), 60000);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(),
              HasSubstr(absl::StrFormat("section %d (type 0x80000005): sh_link 60000 points past the last section",
                                        built.index.at(regs))));
}

TEST(Coredump, AnShLinkToTheWrongKindOfTableIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put32(built.bytes, Field(built, kBadLaneTable, coredump_testing::kShLink), built.index.at(".cudbg.devtbl"));
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(),
              HasSubstr(absl::StrFormat("'.cudbg.lntbl.dev1.sm1.cta0.wp1' (lane table): sh_link %d should name its "
                                        "warp table, but section %d '.cudbg.devtbl' is a device table",
                                        built.index.at(".cudbg.devtbl"), built.index.at(".cudbg.devtbl"))));
}

TEST(Coredump, AnShLinkToTheNullSectionIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put32(built.bytes, Field(built, kBadWarpTable, coredump_testing::kShLink), 0);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(), HasSubstr("should name its CTA table, but section 0 is the null section"));
}

TEST(Coredump, AnShInfoPastTheParentsRowsIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put32(built.bytes, Field(built, kBadLaneTable, coredump_testing::kShInfo), 9);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(),
              HasSubstr("sh_info 9 names row 9 of section " + std::to_string(built.index.at(kBadWarpTable)) +
                        " '.cudbg.wptbl.dev1.sm1.cta0', which has 2 rows"));
}

TEST(Coredump, TwoTablesForOneParentRowAreRefused) {
  BuiltDump built = BuildDump(OneFault());
  Put32(built.bytes, Field(built, kBadLaneTable, coredump_testing::kShInfo), 0);
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(), HasSubstr("are both the lane table of row 0 of"));
}

TEST(Coredump, ASectionNameTableIndexPastTheSectionsIsRefused) {
  BuiltDump built = BuildDump(OneFault());
  built.bytes[62] = 0xfe;  // e_shstrndx
  built.bytes[63] = 0x7f;
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(), HasSubstr("the section-name table is section 32766 (e_shstrndx)"));
}

TEST(Coredump, ACorruptModuleImageLeavesTheFunctionUnknownButTheDumpReads) {
  BuiltDump built = BuildDump(OneFault());
  const uint32_t image = built.index.at(".cudbg.relfimg.dev1.ctx0#1");
  const uint64_t at = built.layout.data_at[image];
  Put64(built.bytes, at + 40, uint64_t{1} << 40);  // the image's e_shoff, far past its end
  absl::StatusOr<Coredump> dump = Read(built.bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  const Location* loc = dump->LocationOf(dump->faults[0]);
  EXPECT_FALSE(loc->function.has_value());
  EXPECT_THAT(loc->why_unknown, HasSubstr("no function symbol in the 2 relocated module images of device row 1 covers "
                                          "0x7f3a00001a40 (1 of them cannot be read: see the notes)"));
  ASSERT_EQ(dump->notes.size(), 1u);
  EXPECT_THAT(dump->notes[0],
              HasSubstr(absl::StrFormat("section %d '.cudbg.relfimg.dev1.ctx0' cannot be read", image)));
  EXPECT_THAT(dump->notes[0], HasSubstr("runs past the end of the file"));
}

// ---- not a CUDA core dump -------------------------------------------------------

TEST(Coredump, BytesThatAreNotACudaCoreDumpAreRefusedAsSuch) {
  EXPECT_EQ(Read({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Read({}).status().message(), HasSubstr("not a CUDA core dump: test.dump: 0 bytes, shorter than"));
  Bytes text(200, 'a');
  EXPECT_THAT(Read(text).status().message(), HasSubstr("not an ELF file"));
  // An x86-64 core file's header.
  ElfWriter x86(4, 62);
  EXPECT_THAT(Read(x86.Write().bytes).status().message(),
              HasSubstr("not a CUDA core dump: e_machine is 62, a CUDA core dump's is 190"));
  // A cubin is EM_CUDA but ET_EXEC.
  EXPECT_THAT(Read(coredump_testing::BuildModuleImage({})).status().message(),
              HasSubstr("e_type is 2, a core dump's is 4 (ET_CORE)"));
  Bytes b = BuildDump(OneFault()).bytes;
  b[4] = 1;  // ELFCLASS32
  EXPECT_THAT(Read(b).status().message(), HasSubstr("ELF class 1 data 1"));
}

// ---- truncation ---------------------------------------------------------------

TEST(Coredump, ADumpCutAtEverySectionBoundaryIsReadOrRefusedClearly) {
  DumpModel m = OneFault();
  m.global_memory = true;  // written last
  const BuiltDump built = BuildDump(m);
  const auto& at = built.layout.data_at;
  const auto& size = built.layout.data_size;
  // Where the last section the reader reads ends.
  uint64_t read_end = 0;
  for (const auto& [name, index] : built.index) {
    for (const char* prefix :
         {".strtab", ".cudbg.devtbl", ".cudbg.meta", ".cudbg.ctxtbl", ".cudbg.modtbl", ".cudbg.relfimg",
          ".cudbg.gridtbl", ".cudbg.smtbl", ".cudbg.ctatbl", ".cudbg.wptbl", ".cudbg.lntbl"}) {
      if (name.starts_with(prefix)) read_end = std::max(read_end, at[index] + size[index]);
    }
  }
  std::vector<uint64_t> cuts = {0, 10, 64, built.layout.headers_at + 64 * 5};
  for (size_t i = 1; i < at.size(); ++i) {
    cuts.push_back(at[i]);
    if (size[i] > 0) cuts.push_back(at[i] + size[i] / 2);
    cuts.push_back(at[i] + size[i]);
  }
  int read = 0, refused = 0;
  for (uint64_t cut : cuts) {
    SCOPED_TRACE(absl::StrFormat("cut at byte %d of %d", cut, built.bytes.size()));
    const Bytes part(built.bytes.begin(), built.bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    absl::StatusOr<Coredump> dump = Read(part);
    if (dump.ok()) {
      ++read;
      // Only sections the reader does not read (registers, backtraces,
      // memory) may be cut while the dump reads; the fault is then whole
      // and the cut is said.
      EXPECT_GE(cut, read_end);
      ASSERT_EQ(dump->faults.size(), 1u);
      EXPECT_EQ(SummaryLines(*dump)[0], SummaryLines(*Read(built.bytes))[0]);
      if (cut < built.bytes.size()) {
        EXPECT_THAT(dump->notes, ::testing::Contains(HasSubstr("the dump is truncated")));
      }
      continue;
    }
    ++refused;
    const absl::StatusCode code = dump.status().code();
    EXPECT_TRUE(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kInvalidArgument) << dump.status();
    EXPECT_THAT(dump.status().message(), HasSubstr("test.dump"));
    EXPECT_THAT(dump.status().message(),
                ::testing::AnyOf(HasSubstr("truncated"), HasSubstr("shorter than the 64-byte")))
        << dump.status();
  }
  EXPECT_GE(read, 2);
  EXPECT_GE(refused, 20);
}

TEST(Coredump, ACutInsideATableNamesTheTable) {
  const BuiltDump built = BuildDump(OneFault());
  const uint32_t warps = built.index.at(kBadWarpTable);
  const uint64_t cut = built.layout.data_at[warps] + 10;
  const Bytes part(built.bytes.begin(), built.bytes.begin() + static_cast<std::ptrdiff_t>(cut));
  absl::StatusOr<Coredump> dump = Read(part);
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(dump.status().message(),
              HasSubstr(absl::StrFormat("section %d '.cudbg.wptbl.dev1.sm1.cta0' (warp table): its 128 bytes at "
                                        "offset %d run past the end of the file (%d bytes): the dump is truncated",
                                        warps, built.layout.data_at[warps], cut)));
}

// ---- names and files ------------------------------------------------------------

TEST(Coredump, ExceptionNamesCoverEveryCodeAndSayWhenOneIsUnknown) {
  EXPECT_EQ(ExceptionName(0), "no exception");
  EXPECT_EQ(ExceptionName(10), "device illegal address");
  EXPECT_EQ(ExceptionName(12), "warp assert");
  EXPECT_EQ(ExceptionName(14), "warp illegal address");
  EXPECT_EQ(ExceptionName(36), "TMA syscall error");
  EXPECT_EQ(ExceptionName(37), "exception 37");
  EXPECT_EQ(ExceptionName(0xffffffffu), "unknown exception");
}

TEST(Coredump, LeftOutByFlagsNamesEachKindAndUnknownBits) {
  EXPECT_TRUE(LeftOutByFlags(0).empty());
  EXPECT_TRUE(LeftOutByFlags(0x10).empty());  // the retired bit leaves nothing out
  EXPECT_EQ(LeftOutByFlags(0x2), std::vector<std::string>{"global memory"});
  EXPECT_EQ(LeftOutByFlags(0x102),
            (std::vector<std::string>{"global memory",
                                      "whatever flag bits 0x100 stand for (this reader does not know them)"}));
}

TEST(Coredump, AFullDumpSaysNothingIsLeftOutAndCountsItsMemory) {
  DumpModel m = OneFault();
  m.meta->flags = 0;
  m.global_memory = true;
  absl::StatusOr<Coredump> dump = Read(BuildDump(m).bytes);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_TRUE(dump->left_out.empty());
  EXPECT_EQ(dump->contents.global_memory, 1u);
  const std::vector<std::string> lines = SummaryLines(*dump);
  EXPECT_THAT(lines, ::testing::Contains("generation flags 0x0: nothing left out"));
  EXPECT_THAT(lines, ::testing::Contains("memory sections: 1 global, 0 managed, 0 shared, 0 local, 0 parameter"));
}

class CoredumpFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("coredump-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(CoredumpFile, AFileIsReadAsItsBytesAre) {
  const Bytes b = BuildDump(OneFault()).bytes;
  const std::string path = (dir_ / "core.nvcudmp").string();
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<long>(b.size()));
  absl::StatusOr<Coredump> dump = ReadCoredumpFile(path);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(SummaryLines(*dump), SummaryLines(*Read(b)));
  EXPECT_EQ(dump->file_bytes, b.size());
}

TEST_F(CoredumpFile, ADirectoryAFifoAndAMissingFileAreRefusedWithoutBlocking) {
  EXPECT_EQ(ReadCoredumpFile(dir_.string()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ReadCoredumpFile(dir_.string()).status().message(), HasSubstr("is a directory, not a regular file"));
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(ReadCoredumpFile(fifo).status().message(), HasSubstr("is a FIFO (named pipe), not a regular file"));
  EXPECT_EQ(ReadCoredumpFile((dir_ / "missing").string()).status().code(), absl::StatusCode::kNotFound);
}

// ---- fuzz seeds -----------------------------------------------------------------

std::vector<std::pair<std::string, Bytes>> FuzzSeeds() {
  DumpModel newer = OneFault();
  newer.extra_row_bytes = 8;
  DumpModel oldest = OneFault();
  oldest.driver = 346;
  oldest.meta.reset();
  DumpModel full = OneFault();
  full.global_memory = true;
  full.meta->flags = 0;
  DumpModel extended = OneFault();
  extended.extended_numbering = true;
  extended.lane_registers = false;
  extended.backtraces = false;
  return {{"one_fault.nvcudmp", BuildDump(OneFault()).bytes},
          {"newer_rows.nvcudmp", BuildDump(newer).bytes},
          {"oldest_rows.nvcudmp", BuildDump(oldest).bytes},
          {"full_dump.nvcudmp", BuildDump(full).bytes},
          {"extended_numbering.nvcudmp", BuildDump(extended).bytes}};
}

std::string SeedDir() {
  const char* src = std::getenv("CRASHREPLAY_SOURCE_DIR");
  return std::string(src != nullptr ? src : ".") + "/fuzz/corpus/coredump";
}

TEST(Coredump, FuzzSeedsMatchTheirBuildersAndRead) {
  const bool regenerate = std::getenv("CRASHREPLAY_REGENERATE_COREDUMPS") != nullptr;
  if (regenerate) std::filesystem::create_directories(SeedDir());
  for (const auto& [name, bytes] : FuzzSeeds()) {
    SCOPED_TRACE(name);
    const std::string path = SeedDir() + "/" + name;
    if (regenerate) {
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<long>(bytes.size()));
    }
    std::ifstream in(path, std::ios::binary);
    const Bytes on_disk((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(on_disk, bytes) << path << ": regenerate as the top of this file says";
    absl::StatusOr<Coredump> dump = Read(bytes);
    ASSERT_TRUE(dump.ok()) << dump.status();
    EXPECT_EQ(dump->faults.size(), 1u);
  }
}

}  // namespace
}  // namespace crashreplay::coredump
