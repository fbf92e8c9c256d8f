"""`crashreplay hash`: shard hashes checked against an independent computation
(numpy slicing of the tensors the safetensors package wrote, hashed by the
xxhsum CLI), the JSON shape, and the root definition of docs/capture.md."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

BIN = os.environ.get("CRASHREPLAY_BIN", "crashreplay")


def xxh128(data: bytes, tmp_path) -> str:
    path = tmp_path / "slice.bin"
    path.write_bytes(data)
    out = subprocess.run(["xxhsum", "-H2", str(path)], check=True, capture_output=True, text=True).stdout
    return out.split()[0]


@pytest.mark.skipif(shutil.which("xxhsum") is None, reason="xxhsum CLI not installed")
def test_hash_json_matches_numpy_slices_and_xxhsum(tmp_path):
    if shutil.which(BIN) is None and not os.path.exists(BIN):
        pytest.skip("crashreplay binary not built")
    rng = np.random.default_rng(1)
    tensors = {
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((8, 6)).astype(np.float16),
        "model.layers.0.self_attn.o_proj.weight": rng.standard_normal((6, 8)).astype(np.float16),
        "model.layers.0.mlp.down_proj.weight": rng.standard_normal((6, 4)).astype(np.float32),
        "model.norm.weight": rng.standard_normal((6,)).astype(np.float16),
    }
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    safetensors_numpy.save_file(tensors, str(ckpt / "model.safetensors"))
    tp = 2
    out = subprocess.run([BIN, "hash", str(ckpt), "--tp", str(tp), "--json", "--verbose"],
                         check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        rank = r["rank"]
        expected = {}
        for name, t in tensors.items():
            if "q_proj" in name:
                part = np.split(t, tp, axis=0)[rank]
            elif "o_proj" in name or "down_proj" in name:
                part = np.split(t, tp, axis=1)[rank]
            else:
                part = t
            expected[name] = np.ascontiguousarray(part).tobytes()
        assert set(r["tensors"]) == set(expected)
        for name, data in expected.items():
            assert r["tensors"][name] == xxh128(data, tmp_path), f"rank {rank} tensor {name}"
        # root = XXH3-128 over, in name order, LE64(len) name high low LE64(size)
        buf = b""
        for name in sorted(expected):
            h = bytes.fromhex(r["tensors"][name])
            high, low = h[:8], h[8:]
            buf += struct.pack("<Q", len(name)) + name.encode() + high[::-1] + low[::-1]
            buf += struct.pack("<Q", len(expected[name]))
        assert r["root"] == xxh128(buf, tmp_path)

    plain = subprocess.run([BIN, "hash", str(ckpt), "--tp", str(tp), "--json"],
                           check=True, capture_output=True, text=True).stdout
    assert all("tensors" not in r for r in json.loads(plain)["ranks"])


def test_hash_refuses_an_indivisible_tp(tmp_path):
    if shutil.which(BIN) is None and not os.path.exists(BIN):
        pytest.skip("crashreplay binary not built")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    safetensors_numpy.save_file({"model.layers.0.self_attn.q_proj.weight": np.zeros((6, 4), np.float16)},
                                str(ckpt / "model.safetensors"))
    p = subprocess.run([BIN, "hash", str(ckpt), "--tp", "4"], capture_output=True, text=True)
    assert p.returncode == 2
    assert "q_proj" in p.stderr


def _built():
    if shutil.which(BIN) is None and not os.path.exists(BIN):
        pytest.skip("crashreplay binary not built")


@pytest.mark.parametrize("what", ["fifo", "directory", "dev_zero", "fifo_config"])
def test_hash_refuses_what_is_not_a_regular_file_at_once_with_exit_3(tmp_path, what):
    _built()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shard = ckpt / "model.safetensors"
    if what == "fifo":
        os.mkfifo(shard)
    elif what == "directory":
        shard.mkdir()
    elif what == "dev_zero":
        shard.symlink_to("/dev/zero")
    else:  # a FIFO config.json next to a good shard
        safetensors_numpy.save_file({"w": np.zeros((2,), np.float16)}, str(shard))
        os.mkfifo(ckpt / "config.json")
    # A reader that waited on the FIFO would be killed by the timeout.
    p = subprocess.run([BIN, "hash", str(ckpt)], capture_output=True, text=True, timeout=20)
    assert p.returncode == 3, p.stderr
    assert "not a regular file" in p.stderr


def test_hash_of_a_100k_tensor_shard(tmp_path):
    _built()
    # Written as the safetensors package writes it (sorted by name, U8);
    # the old strict DOM parse took minutes here.
    n = 100_000
    names = sorted(f"model.layers.{i // 256}.mlp.experts.{i % 256}.w" for i in range(n))
    header = {name: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]} for i, name in enumerate(names)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(n))
    p = subprocess.run([BIN, "hash", str(ckpt), "--json", "--verbose"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(json.loads(p.stdout)["ranks"][0]["tensors"]) == n
