// Text <-> token ids for the built-in engine's `run`.
//
// Two tokenizers:
// * bytes: one token per byte (id = byte value); what the random
//   checkpoints of `make-model` use;
// * a checkpoint's tokenizer.json (Hugging Face `tokenizers` format), for
//   the byte-level BPE family that llama-3, qwen2/qwen3, DeepSeek-V3 and
//   GLM-4.5 use: model BPE over byte-level symbols, merges by rank
//   (`ignore_merges` honoured), added/special tokens matched first, a
//   pre-tokenizer that is ByteLevel (GPT-2 split) or a Sequence of
//   Split(regex or string, behaviour Isolated) and ByteLevel, the NFC or no
//   normalizer, and a TemplateProcessing or ByteLevel post-processor. The
//   Split regexes run under Oniguruma, the regex engine `tokenizers` itself
//   uses, so \p{L}, \p{N} and lookaheads mean what they mean there.
//
// Limits: NFC normalization is not applied (text is taken as already NFC,
// as nearly all text is); a tokenizer.json outside the family above
// (sentencepiece-style Metaspace/byte_fallback, WordPiece, Unigram, other
// normalizers) is refused with Unimplemented naming the field, and `run`
// then falls back to bytes and says so.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace crashreplay::replay {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids of `text`, with the post-processor's special tokens (a BOS) when
  // `add_special_tokens`.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const = 0;
  // Text of `ids`; an id without a token is InvalidArgument naming it.
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const = 0;
  // Whether Decode knows `id`.
  virtual bool HasToken(int32_t id) const = 0;
  // One line: "bytes" or "tokenizer.json: BPE, N tokens, M merges".
  virtual std::string Describe() const = 0;
  // One past the largest id it can produce.
  virtual int64_t VocabSize() const = 0;
};

std::unique_ptr<Tokenizer> MakeByteTokenizer();

// Parses a tokenizer.json text; `origin` names it in errors.
// InvalidArgument: malformed JSON or a field of the wrong type (named);
// Unimplemented: a model/pre-tokenizer/normalizer outside the family above.
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseTokenizerJson(std::string_view json, const std::string& origin);

// Reads `path`; NotFound when it does not exist.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerJson(const std::string& path);

// The tokenizer for checkpoint `dir`. `choice`: "auto" (dir/tokenizer.json
// when present and of the supported family; bytes otherwise, with `note`
// saying why when a tokenizer.json was there but is not supported; a
// malformed one is an error), "bytes", or the path of a tokenizer.json
// (any failure is an error).
absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerForCheckpoint(const std::string& dir, const std::string& choice,
                                                                  std::string* note);

}  // namespace crashreplay::replay
