"""`crashreplay tokenize` / `run` with a checkpoint's tokenizer.json, against
Hugging Face `tokenizers` itself (a small PyPI wheel, installed by
scripts/setup.sh).

The tokenizers are trained here, in the layouts real checkpoints ship:
GPT-2 style (ByteLevel with its own regex), llama-3 style (a Split regex
with \\p{L}/\\p{N} classes and lookahead, ByteLevel without regex, a BOS
TemplateProcessing post-processor, ignore_merges), qwen2/3 style (NFC
normalizer, the qwen Split regex, ByteLevel post-processor), and
DeepSeek-V3 style (a Sequence of several Split regexes). Every text must
encode to the same ids as `tokenizers` encodes it, and decode back.
"""
import json
import os
import subprocess

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "Say hello in one sentence. Hello! How are you doing today?",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "def forward(self, x):\n    return self.proj(x) + 42\n\n",
    "I'm sure they'll say we've done it; you'd agree, wouldn't you?",
    "Grüße aus München — naïve café, 東京タワー, Привет мир, 😀 emoji.",
    "   leading spaces, trailing spaces   \t tabs\tand\r\nnewlines\n\n\n",
] * 20

TEXTS = [
    "Say hello in one sentence",
    "Hello, world! 12345 + 678 = 13023",
    "I'm here, they'll come; WE'VE SEEN IT",
    "  two leading spaces and two trailing  ",
    "line one\nline two\r\n\n  indented\tline",
    "Grüße, naïve café — 東京 Привет 😀",
    "<|im_start|>user\nhi<|im_end|>",
    "tail<|endoftext|>",
    "x",
    "",
]


def train(kind):
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif kind == "gpt2_prefix":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    elif kind == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif kind == "qwen":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif kind == "deepseek":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated"),
            pre_tokenizers.Split(Regex(r"[一-龥\u3040-ゟ゠-ヿ]+"), behavior="isolated"),
            pre_tokenizers.Split(Regex(QWEN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if kind == "llama3":
        tok.add_special_tokens(["<|begin_of_text|>"])
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", bos)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenize(model_dir, *args):
    r = subprocess.run([BIN, "tokenize", str(model_dir), "--json", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("kind", ["gpt2", "gpt2_prefix", "llama3", "qwen", "deepseek"])
def test_encode_and_decode_match_hf_tokenizers(tmp_path, kind):
    hf = train(kind)
    hf.save(str(tmp_path / "tokenizer.json"))
    got = tokenize(tmp_path, *TEXTS)
    assert got["tokenizer"].endswith(f"BPE, {hf.get_vocab_size(with_added_tokens=False)} tokens, "
                                     f"{len(json.load(open(tmp_path / 'tokenizer.json'))['model']['merges'])} merges, "
                                     f"{len(hf.get_added_tokens_decoder())} added tokens"), got["tokenizer"]
    for text, enc in zip(TEXTS, got["encoded"]):
        want = hf.encode(text).ids
        assert enc["ids"] == want, f"{kind}: {text!r}: crashreplay {enc['ids']} vs tokenizers {want}"
    plain = tokenize(tmp_path, "--no-special", TEXTS[0])
    assert plain["encoded"][0]["ids"] == hf.encode(TEXTS[0], add_special_tokens=False).ids
    ids = hf.encode(TEXTS[5], add_special_tokens=False).ids
    dec = tokenize(tmp_path, "--ids", ",".join(map(str, ids)))
    assert dec["decoded"][0]["text"] == hf.decode(ids, skip_special_tokens=False)


def test_run_uses_the_checkpoints_tokenizer_json(tmp_path):
    model = tmp_path / "model"
    hf = train("llama3")
    r = subprocess.run([BIN, "make-model", str(model), "--arch", "llama", "--quant", "bf16", "--vocab",
                        str(hf.get_vocab_size(with_added_tokens=True))], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    hf.save(str(model / "tokenizer.json"))
    r = subprocess.run([BIN, "run", str(model), "--prompt", "Say hello in one sentence", "--max-new-tokens", "3",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "BPE" in out["tokenizer"]
    toks = out["outputs"][0]["tokens"]
    assert out["outputs"][0]["text"] == hf.decode(toks, skip_special_tokens=False)
    # a model vocabulary larger than the tokenizer's: ids without a token print as <id>
    r = subprocess.run([BIN, "make-model", str(tmp_path / "big"), "--arch", "llama", "--quant", "bf16", "--vocab",
                        "2048"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    hf.save(str(tmp_path / "big" / "tokenizer.json"))
    r = subprocess.run([BIN, "run", str(tmp_path / "big"), "--prompt", "hello", "--max-new-tokens", "8", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    big = json.loads(r.stdout)["outputs"][0]
    n = hf.get_vocab_size(with_added_tokens=True)
    want, run = "", []
    for t in big["tokens"] + [None]:
        if t is not None and t < n:
            run.append(t)
            continue
        want += hf.decode(run, skip_special_tokens=False) if run else ""
        run = []
        want += f"<{t}>" if t is not None else ""
    assert big["text"] == want
    # the prompt reached the engine as the tokenizer's ids (BOS first)
    r = subprocess.run([BIN, "run", str(model), "--prompt-ids",
                        ",".join(map(str, hf.encode("Say hello in one sentence").ids)), "--max-new-tokens", "3",
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outputs"][0]["tokens"] == toks


def test_unsupported_and_malformed_tokenizer_json(tmp_path):
    model = tmp_path / "model"
    subprocess.run([BIN, "make-model", str(model), "--arch", "llama", "--quant", "bf16"], check=True,
                   capture_output=True)
    wp = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    wp.save(str(model / "tokenizer.json"))
    r = subprocess.run([BIN, "run", str(model), "--prompt", "hi", "--max-new-tokens", "1", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "model.type 'WordPiece' is not supported" in r.stderr and "tokenized as bytes" in r.stderr
    assert json.loads(r.stdout)["tokenizer"] == "bytes"
    (model / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]}}')
    r = subprocess.run([BIN, "run", str(model), "--prompt", "hi"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "model.merges[0] 'a': expected two tokens separated by one space" in r.stderr
    (model / "tokenizer.json").write_text('{"model": ')
    r = subprocess.run([BIN, "tokenize", str(model), "hi"], capture_output=True, text=True)
    assert r.returncode == 2 and "not a JSON object" in r.stderr
    r = subprocess.run([BIN, "tokenize", str(model), "--tokenizer", "bytes", "hi"], capture_output=True, text=True)
    assert r.returncode == 0 and "[104,105]" in r.stdout
