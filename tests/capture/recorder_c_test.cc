// The C ABI: a session driven only through recorder_c.h, read back with
// the C++ reader; error codes and messages.
#include <cstring>

#include <gtest/gtest.h>

#include "crashreplay/capture/recorder_c.h"
#include "crashreplay/formats/capture_reader.h"
#include "recorder_test_util.h"

namespace crashreplay::testing {
namespace {

constexpr const char* kManifest = R"({
  "session_id": "s-1", "engine": "sglang", "engine_version": "0.5.5",
  "model": {"model_type": "qwen3_moe", "num_layers": 48, "num_experts": 128},
  "toggles": {"attention_backend": "fa3", "mem_fraction_static": 0.9, "cuda_graph": true, "tp_size": 2},
  "parallel": {"tp_size": 2, "tp_rank": 1, "world_size": 2, "rank": 1},
  "features": ["overlap_schedule"]
})";

TEST(RecorderC, SessionThroughTheCAbiReadsBackInCpp) {
  RecorderTempDir dir;
  cr_recorder_options o;
  cr_recorder_options_init(&o);
  const std::string session = dir.path();
  o.session_dir = session.c_str();
  o.install_signal_handlers = 0;
  o.snapshot_ring_bytes = 1 << 20;
  cr_recorder* r = nullptr;
  ASSERT_EQ(cr_recorder_begin(kManifest, &o, &r), CR_OK) << cr_last_error();
  EXPECT_EQ(std::string(cr_recorder_path(r)), capture::SessionRankPath(session, 1));

  const char* ids[] = {"a", "b"};
  const int64_t tokens[] = {11, 12}, positions[] = {5, 9}, seq_lens[] = {6, 10}, pool[] = {0, 1};
  const int64_t pt_offsets[] = {0, 2, 5}, pt_slots[] = {100, 101, 200, 201, 202}, out_loc[] = {101, 202};
  const cr_sampling sampling[] = {{0.5f, 0.9f, 10, 0.0f, 7, 1}, {1.0f, 1.0f, -1, 0.1f, 0, 0}};
  const cr_digest digests[] = {{"logits", 0, 0xabcdef, 0, 0}};
  cr_step s{};
  s.step = 3;
  s.mode = CR_MODE_DECODE;
  s.request_ids = ids;
  s.num_requests = 2;
  s.token_ids = tokens;
  s.num_tokens = 2;
  s.positions = positions;
  s.num_positions = 2;
  s.seq_lens = seq_lens;
  s.num_seq_lens = 2;
  s.req_pool_indices = pool;
  s.num_req_pool_indices = 2;
  s.page_table_offsets = pt_offsets;
  s.num_page_table_rows = 2;
  s.page_table_slots = pt_slots;
  s.num_page_table_slots = 5;
  s.out_cache_loc = out_loc;
  s.num_out_cache_loc = 2;
  s.sampling = sampling;
  s.num_sampling = 2;
  s.rng_seed = 99;
  s.rng_offset = 12;
  s.output_token_ids = tokens;
  s.num_output_token_ids = 2;
  s.digests = digests;
  s.num_digests = 1;
  ASSERT_EQ(cr_recorder_record_step(r, &s), CR_OK) << cr_last_error();

  const std::vector<std::byte> bytes = RandomBytes(4096, 9);
  const int64_t shape[] = {2048};
  const cr_tensor t{"hidden", "BF16", shape, 1, bytes.data(), bytes.size()};
  ASSERT_EQ(cr_recorder_submit_snapshot(r, 3, &t, 1), CR_OK) << cr_last_error();
  uint64_t hi = 0, lo = 0;
  ASSERT_EQ(cr_recorder_record_weight_hashes(r, 1, &t, 1, &hi, &lo), CR_OK) << cr_last_error();
  const cr_failure f{"device-side assert triggered", "decode", 1, 3, CR_FAILURE_DEVICE_ASSERT,
                     "torch.AcceleratorError",       ""};
  ASSERT_EQ(cr_recorder_on_failure(r, &f), CR_OK) << cr_last_error();
  cr_recorder_stats st;
  ASSERT_EQ(cr_recorder_stats_get(r, &st), CR_OK);
  EXPECT_EQ(st.steps_written, 1u);
  ASSERT_EQ(cr_recorder_close(r), CR_OK) << cr_last_error();
  cr_recorder_free(r);

  auto reader = ReadCapture(capture::SessionRankPath(session, 1));
  ASSERT_NE(reader, nullptr);
  const SessionManifest& m = *reader->manifest();
  EXPECT_EQ(m.engine, "sglang");
  EXPECT_EQ(m.parallel.rank, 1u);
  EXPECT_EQ(m.model.num_experts, 128u);
  ASSERT_EQ(m.toggles.size(), 4u);
  EXPECT_EQ(m.toggles[0].name, "attention_backend");
  EXPECT_EQ(std::get<double>(m.toggles[2].value), 0.9);
  ASSERT_EQ(reader->steps().size(), 1u);
  const StepRecord& step = reader->steps()[0];
  EXPECT_EQ(step.rank, 1u);
  EXPECT_EQ(step.request_ids, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(step.page_table.size(), 2u);
  EXPECT_EQ(step.page_table[1].req_pool_index, 1);
  EXPECT_EQ(step.page_table[1].token_slots, (std::vector<int64_t>{200, 201, 202}));
  EXPECT_EQ(step.sampling[0].top_k, 10);
  EXPECT_TRUE(step.sampling[0].has_seed);
  EXPECT_EQ(std::get<uint64_t>(step.digests.at(0).value), 0xabcdefu);
  ASSERT_EQ(reader->weight_hashes().size(), 1u);
  EXPECT_EQ(reader->weight_hashes()[0].shards.at(0).root, (Hash128{hi, lo}));
  EXPECT_EQ(reader->weight_hashes()[0].shards[0].tensors.at(0).hash, XXH128Of(bytes));
  ASSERT_EQ(reader->snapshots().size(), 1u);
  ASSERT_EQ(reader->failures().size(), 1u);
  EXPECT_EQ(reader->failures()[0].failure_class, FailureClass::kDeviceAssert);
  EXPECT_TRUE(reader->Summary().ok);
}

TEST(RecorderC, ErrorsComeBackAsCodesWithAMessage) {
  cr_recorder* r = nullptr;
  cr_recorder_options o;
  cr_recorder_options_init(&o);
  o.session_dir = "/tmp";
  EXPECT_EQ(cr_recorder_begin(R"({"engien": "x"})", &o, &r), CR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(cr_last_error(), "engien"), nullptr) << cr_last_error();
  EXPECT_EQ(r, nullptr);
  EXPECT_EQ(cr_recorder_begin("{", &o, &r), CR_INVALID_ARGUMENT);
  cr_recorder_options none;
  cr_recorder_options_init(&none);
  EXPECT_EQ(cr_recorder_begin("{}", &none, &r), CR_INVALID_ARGUMENT) << "no session_dir nor path";
  EXPECT_NE(std::strstr(cr_last_error(), "session_dir"), nullptr) << cr_last_error();
  char hex[33];
  cr_xxh128_hex("abc", 3, hex);
  EXPECT_EQ(std::string(hex), XXH128Of("abc", 3).Hex());
}

}  // namespace
}  // namespace crashreplay::testing
