"""Layer streaming through the CLI (issue 15): a checkpoint several times
larger than the address space the process may use (`ulimit -v`, set here
with RLIMIT_AS on the child) replays bit-identically to the unconstrained,
resident run. `weights=auto` chooses streaming by itself under the cap and
says so; resident weights under the same cap fail with a message that names
the way out. A capture recorded in sglang's manifest form verifies its
weights (engine layout, read from the deferred checkpoint) while streaming.
"""
import json
import os
import resource
import subprocess

import pytest

BIN = os.environ.get("CRASHREPLAY_BIN", "build/tools/crashreplay")
pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason="needs the crashreplay binary (CRASHREPLAY_BIN)")


def run(*args, cap=None):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=600,
                          preexec_fn=limit if cap else None)


def digests(replay_json):
    return [(k["name"], k["digest"]) for k in replay_json["kernels"]]


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 227 MB llama whose layers are most of it (10 of 22.5 MB, vocabulary
    512), and a recording of it made without limits: prefill, then two
    decode steps. A third of it (76 MB) must hold the process itself as well
    as a streamed layer: the binary maps 13-20 MB of code (most of it the
    CUDA kernels' fatbin), and a streamed replay of this model needed 56 MB
    of address space in all when the test was sized (64 MB with a larger
    fatbin, past the 61 MB cap that 8 layers gave)."""
    d = tmp_path_factory.mktemp("stream")
    model, rec = d / "big", d / "rec"
    r = run("make-model", model, "--arch", "llama", "--layers", "10", "--hidden", "1024", "--heads", "16",
            "--kv-heads", "4", "--head-dim", "64", "--intermediate", "2816", "--vocab", "512")
    assert r.returncode == 0, r.stderr
    r = run("run", model, "--prompt", "Say hello in one sentence", "--max-new-tokens", "3", "--record", rec,
            "--set", "weights=resident")
    assert r.returncode == 0, r.stderr
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    return model, rec, size


def test_a_checkpoint_three_times_the_address_space_cap_replays_bit_identically(big):
    model, rec, size = big
    cap = size // 3
    assert size > 220e6 and cap < 77e6
    free = run("replay", rec, "--step", "2", "--json", "--set", "weights=resident")
    assert free.returncode == 0, free.stderr
    free_json = json.loads(free.stdout)
    capped = run("replay", rec, "--step", "2", "--json", cap=cap)  # weights=auto, the default
    assert capped.returncode == 0, capped.stderr
    capped_json = json.loads(capped.stdout)
    assert capped_json["outcome"] == "reproduced"
    assert "weights=auto" in capped.stderr and "ulimit -v" in capped.stderr, capped.stderr
    assert any("streaming the weights one layer at a time" in n for n in capped_json["notes"])
    assert capped_json["weights"] == free_json["weights"] and capped_json["weights"].startswith("verified")
    assert digests(capped_json) == digests(free_json)
    assert len(digests(free_json)) > 8 * 10  # every kernel of every layer, digest by digest
    assert capped_json["start"] == free_json["start"] == "snapshot"
    # Re-executing the steps before it streams every layer of each of them too.
    again = run("replay", rec, "--step", "2", "--json", "--from-start", cap=cap)
    assert again.returncode == 0, again.stderr
    again_json = json.loads(again.stdout)
    assert again_json["start"] == "re-executed" and digests(again_json) == digests(free_json)


def test_run_under_the_cap_gives_the_tokens_and_step_digests_of_the_free_run(big):
    model, _, size = big
    args = ("run", model, "--prompt", "Say hello in one sentence", "--max-new-tokens", "3", "--json")
    free = run(*args, "--set", "weights=resident")
    capped = run(*args, "--set", "weights=stream", cap=size // 3)
    assert free.returncode == 0 and capped.returncode == 0, capped.stderr
    a, b = json.loads(free.stdout), json.loads(capped.stdout)
    assert [s["digest"] for s in a["steps"]] == [s["digest"] for s in b["steps"]]
    assert a["outputs"] == b["outputs"]


def test_resident_weights_under_the_cap_fail_naming_the_way_out(big):
    _, rec, size = big
    r = run("replay", rec, "--set", "weights=resident", cap=size // 3)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "out of address space (ulimit -v?)" in r.stderr and "--set weights=stream" in r.stderr, r.stderr


def test_an_sglang_manifest_verifies_its_weights_while_streaming(tmp_path):
    model, rec, cfg = tmp_path / "m", tmp_path / "rec", tmp_path / "sglang.toml"
    assert run("make-model", model, "--arch", "glm_moe_dsa", "--quant", "nvfp4").returncode == 0
    cfg.write_text('engine = "sglang"\ntp_size = 2\n')
    r = run("run", model, "--config", cfg, "--prompt", "say hello", "--max-new-tokens", "2", "--record", rec)
    assert r.returncode == 0, r.stderr
    out = {}
    for w in ("resident", "stream"):
        r = run("replay", rec, "--json", "--set", f"weights={w}")
        assert r.returncode == 0, r.stderr
        out[w] = json.loads(r.stdout)
    assert "(sglang layout)" in out["stream"]["weights"] and out["stream"]["weights"] == out["resident"]["weights"]
    assert digests(out["stream"]) == digests(out["resident"])
