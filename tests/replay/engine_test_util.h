// Helpers for engine tests: a random checkpoint built into an Engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "crashreplay/replay/make_model/random_checkpoint.h"
#include "crashreplay/replay/session/engine.h"

namespace crashreplay::replay::testing {

inline std::unique_ptr<Engine> MakeEngine(const MakeModelOptions& opts, const std::vector<std::string>& sets,
                                          int threads = 1) {
  auto ckpt = GenerateRandomCheckpoint(opts);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  if (!ckpt.ok()) return nullptr;
  Config c = Config::Defaults();
  for (const std::string& s : sets) EXPECT_TRUE(c.ApplySetFlag(s).ok()) << s;
  const EngineConfig ec = ResolveConfig(c);
  auto model = BuildModel(ckpt->spec, ckpt->tensors, ec);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  auto e = Engine::Create(std::move(*model), ec, threads, 4096);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return nullptr;
  return std::move(*e);
}

inline std::vector<Request> TwoRequests(int64_t max_new = 4, float temperature = 0.0f) {
  std::vector<Request> r(2);
  const std::string a = "Say hello in one sentence", b = "Hi";
  r[0].id = 1;
  r[0].prompt.assign(a.begin(), a.end());
  r[1].id = 2;
  r[1].prompt.assign(b.begin(), b.end());
  for (auto& q : r) {
    q.max_new_tokens = max_new;
    q.sampling.temperature = temperature;
    q.sampling.top_p = 0.9f;
    q.sampling.seed = 42;
  }
  return r;
}

}  // namespace crashreplay::replay::testing
