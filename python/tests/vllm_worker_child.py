"""A vLLM worker (tensor-parallel size 1) on the CPU, recorded by crashreplay.vllm.

Run by test_adapters_vllm_real.py:
    python vllm_worker_child.py MODEL_DIR SESSION_DIR PORT SCHEDULE_JSON

What is vLLM's own and what is not:
  * vLLM's: VllmConfig and its checks, the process groups
    (init_distributed_environment over gloo), the model class and its weight
    loaders (get_model: QKVParallelLinear, MergedColumnParallelLinear,
    VocabParallelEmbedding as on a GPU), the BlockPool that hands out KV
    block ids, InputBatch (the second-generation runner's), SamplingParams
    and SamplingStates.add_request, the GPUModelRunner object;
  * not vLLM's: GPUModelRunner.__init__/load_model are not run (they
    allocate CUDA buffers); the runner is made with __new__ and given the
    loaded model. BlockTables and SamplingStates' constructors need the
    CUDA driver, so objects holding the same arrays stand in for them
    (written by vLLM's add_request). vLLM has no CPU attention backend
    without its CPU build (vllm._C, triton-cpu): the platform's attention
    selector is pointed at CPUAttentionBackend so the model can be built;
    attention never runs here. With "fingerprints" in the schedule, vLLM's
    embedding module runs on each step's tokens.
"""
import dataclasses
import json
import sys
from types import SimpleNamespace

import numpy as np
import torch


def main(model_dir, session_dir, port, schedule):
    from vllm.platforms import current_platform

    type(current_platform).get_attn_backend_cls = classmethod(
        lambda cls, *a, **k: "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend")
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader import get_model
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.sample.states import SamplingStates

    from crashreplay import vllm as cr_vllm

    block = schedule["block_size"]
    mc = ModelConfig(model=model_dir, dtype="bfloat16", skip_tokenizer_init=True, enforce_eager=True,
                     seed=schedule["seed"])
    vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=block), device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
        initialize_model_parallel(1)
        model = get_model(vllm_config=vc)
    # What the worker's init_device does through vllm.utils.torch_utils.
    # set_random_seed (whose platform half needs a device platform here).
    np.random.seed(mc.seed)
    torch.manual_seed(mc.seed)

    requests = schedule["requests"]
    n, vocab, max_reqs = len(requests), mc.get_vocab_size(), 4
    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.vllm_config = vc
    runner.model = model
    runner.block_tables = SimpleNamespace(block_sizes=[block])
    states = SimpleNamespace(max_num_reqs=max_reqs, vocab_size=vocab, temperature=SimpleNamespace(np=np.zeros(max_reqs, np.float32)),
                             top_k=SimpleNamespace(np=np.full(max_reqs, vocab, np.int32)),
                             top_p=SimpleNamespace(np=np.ones(max_reqs, np.float32)),
                             min_p=SimpleNamespace(np=np.zeros(max_reqs, np.float32)),
                             seeds=SimpleNamespace(np=np.zeros(max_reqs, np.int64)), seeds_set=np.zeros(max_reqs, bool),
                             num_logprobs=np.full(max_reqs, -1, np.int32))
    slots = list(range(n))  # request-state slots
    for i, r in enumerate(requests):
        SamplingStates.add_request(states, slots[i], SamplingParams(temperature=r.get("temperature", 0.0),
                                                                    seed=r.get("seed")))
    runner.sampler = SimpleNamespace(sampling_states=states)
    fingerprints = bool(schedule.get("fingerprints"))
    adapter = cr_vllm.attach(runner, session_dir, install_signal_handlers=False, fingerprints=fingerprints,
                             coredumps=bool(schedule.get("coredumps")))
    cr_vllm.record_weights(adapter, runner)

    pool = BlockPool(num_gpu_blocks=64, enable_caching=False, hash_block_size=block)
    blocks = [[] for _ in range(n)]
    computed = [0] * n
    fields = {f.name for f in dataclasses.fields(InputBatch)}
    width = 16

    def run_step(new_tokens):
        """One step: new_tokens[i] are request i's tokens fed this step."""
        scheduled = np.array([len(t) for t in new_tokens], np.int32)
        total = int(scheduled.sum())
        for i in range(n):
            need = -(-(computed[i] + scheduled[i]) // block) - len(blocks[i])
            blocks[i] += [b.block_id for b in pool.get_new_blocks(need)] if need > 0 else []
        table = torch.zeros((max_reqs, width), dtype=torch.int32)
        for i in range(n):
            table[slots[i], :len(blocks[i])] = torch.tensor(blocks[i], dtype=torch.int32)
        positions = np.concatenate([np.arange(computed[i], computed[i] + scheduled[i]) for i in range(n)])
        req_of = np.repeat(np.arange(n), scheduled)
        slot_mapping = torch.tensor([blocks[r][p // block] * block + p % block for r, p in zip(req_of, positions)])
        qsl = np.concatenate([[0], np.cumsum(scheduled)])
        values = dict(
            req_ids=[r["rid"] for r in requests], num_reqs=n, num_reqs_after_padding=n,
            idx_mapping=torch.tensor(slots), idx_mapping_np=np.array(slots), expanded_idx_mapping=torch.tensor(slots),
            expanded_local_pos=torch.zeros(n, dtype=torch.int32), num_scheduled_tokens=scheduled, num_tokens=total,
            num_tokens_after_padding=total, num_draft_tokens=0, num_draft_tokens_per_req=None,
            query_start_loc=torch.tensor(qsl), query_start_loc_np=qsl,
            seq_lens=torch.tensor(np.array(computed) + scheduled), seq_lens_cpu_upper_bound=None,
            dcp_local_seq_lens=None, num_computed_tokens_np=np.array(computed, np.int32),
            prefill_len_np=np.array([len(r["prompt"]) for r in requests]),
            num_computed_prefill_tokens_np=np.minimum(np.array(computed), [len(r["prompt"]) for r in requests]),
            is_prefilling_np=np.array([c == 0 for c in computed]), has_prefill=any(c == 0 for c in computed),
            decode_graph_eligible=all(c > 0 for c in computed),
            input_ids=torch.tensor([t for ts in new_tokens for t in ts]), positions=torch.tensor(positions),
            is_padding=torch.zeros(total, dtype=bool), logits_indices=torch.tensor(qsl[1:] - 1),
            cu_num_logits=torch.arange(n + 1), cu_num_logits_np=np.arange(n + 1), has_structured_output_reqs=False,
            prompt_lens=np.array([len(r["prompt"]) for r in requests]))
        ib = InputBatch(**{k: v for k, v in values.items() if k in fields})
        adapter.after_prepare_v2(runner, ib)
        adapter.after_attn_v2(runner, ib, ((table,), slot_mapping[None, :]))
        if fingerprints:
            # vLLM's own embedding module on the step's tokens, then the end
            # of execute_model (where the adapter summarises the step).
            runner.model.model.embed_tokens(ib.input_ids)
            adapter.flush_fingerprints()
        for i in range(n):
            computed[i] += int(scheduled[i])

    run_step([r["prompt"] for r in requests])
    for step in range(schedule["decode_steps"]):
        run_step([[(5 * step + 13 * i + 1) % vocab] for i in range(n)])
    adapter.recorder.close()
    print(json.dumps({"path": adapter.recorder.path,
                      "boundaries": adapter.hooks.names if adapter.hooks is not None else []}))


if __name__ == "__main__":
    model_dir, session_dir, port, sched = sys.argv[1:5]
    main(model_dir, session_dir, int(port), json.loads(sched))
