"""One sglang tensor-parallel rank, on the CPU, recorded by crashreplay.sglang.

Run by test_adapters_sglang_real.py, once per rank:
    python sglang_rank_child.py MODEL_DIR SESSION_DIR RANK TP PORT STEPS_JSON

What is sglang's own and what is not:
  * sglang's: ServerArgs and its resolution, the launcher's publish() of the
    rank (what run_scheduler_process does), the process groups
    (bootstrap.init_parallel_runtime over gloo), ModelConfig, the model class
    and its weight loaders (model_loader.get_model: QKVParallelLinear,
    MergedColumnParallelLinear, VocabParallelEmbedding shard and fuse the
    checkpoint exactly as on a GPU), ReqToTokenPool, the paged KV allocator
    (PagedTokenToKVPoolAllocator, its CPU path), ForwardMode, ForwardBatch,
    SamplingBatchInfo, Scheduler, TpModelWorker and ModelRunner objects;
  * not sglang's: Scheduler.__init__ is not run (it builds the whole
    server: ZMQ sockets, CUDA graphs, attention backends); the objects it
    would leave are made with __new__ and given the attributes the adapter
    reads. The ModelRunner's forward is a function returning None (with
    "fingerprints" in the schedule: sglang's embedding module on the
    batch's tokens): sglang's attention kernels need a GPU, and what is
    recorded is the step's inputs.
    PyNccl is off (use_pynccl=False): it needs CUDA; gloo carries the groups.
The step schedule (requests, prompt lengths, decode steps) comes from
STEPS_JSON; every rank runs the same schedule, as TP ranks do.
"""
import json
import os
import sys

import torch


def main(model_dir, session_dir, rank, tp, port, schedule):
    os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "|".join(["0"] * tp))
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import bootstrap
    import sglang.srt.distributed.parallel_state as ps
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_loader import get_model
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.server_args import ServerArgs

    from crashreplay import sglang as cr_sglang

    page = schedule["page_size"]
    sa = ServerArgs(model_path=model_dir, device="cpu", tp_size=tp, page_size=page, skip_tokenizer_init=True,
                    random_seed=schedule["seed"], max_total_tokens=schedule["max_total_tokens"],
                    max_prefill_tokens=schedule["max_prefill_tokens"],
                    cuda_graph_max_bs_decode=schedule["cuda_graph_max_bs_decode"],
                    mem_fraction_static=schedule["mem_fraction_static"], ep_size=schedule.get("ep_size", 1))
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=rank, gpu_id=rank))
    orig_group = ps.init_model_parallel_group

    def cpu_group(*args, **kwargs):  # PyNccl needs CUDA
        kwargs["use_pynccl"] = False
        kwargs["use_custom_allreduce"] = False
        return orig_group(*args, **kwargs)

    ps.init_model_parallel_group = cpu_group
    bootstrap.init_parallel_runtime(server_args=sa, device="cpu", dist_port=port)
    model_config = ModelConfig.from_server_args(sa)
    bootstrap.init_layer_runtime(model_config=model_config)
    model = get_model(model_config=model_config, load_config=LoadConfig(load_format="auto"),
                      device_config=DeviceConfig("cpu", rank))
    torch.manual_seed(schedule["seed"])

    pool_rows, context = 8, 512
    req_to_token = ReqToTokenPool(size=pool_rows, max_context_len=context, device="cpu", enable_memory_saver=False)
    allocator = PagedTokenToKVPoolAllocator(size=pool_rows * context, page_size=page, dtype=torch.int64,
                                            device="cpu", kvcache=None, need_sort=False)
    allocator.use_triton_kernels = False  # sglang's CPU path (alloc_extend_naive)

    runner = ModelRunner.__new__(ModelRunner)
    runner.model = model
    runner.req_to_token_pool = req_to_token
    runner.token_to_kv_pool_allocator = allocator
    fingerprints = bool(schedule.get("fingerprints"))
    if fingerprints:
        # sglang's own embedding module runs (VocabParallelEmbedding: this
        # rank's vocabulary shard, masked, all-reduced over gloo); the rest of
        # the forward needs sglang's GPU kernels.
        runner.forward = lambda forward_batch, *a, **k: model.model.embed_tokens(forward_batch.input_ids)
    else:
        runner.forward = lambda forward_batch, *a, **k: None
    worker = TpModelWorker.__new__(TpModelWorker)
    worker._model_runner = runner  # what TpModelWorker.__init__ sets; model_runner is its property
    scheduler = Scheduler.__new__(Scheduler)
    scheduler.server_args = sa
    scheduler.model_config = model_config
    scheduler.tp_worker = worker
    scheduler.max_running_requests = pool_rows
    scheduler.max_total_num_tokens = pool_rows * context
    scheduler.max_prefill_tokens = schedule["max_prefill_tokens"]
    adapter = cr_sglang.attach(scheduler, session_dir, install_signal_handlers=False, fingerprints=fingerprints)

    requests = schedule["requests"]  # [{"rid", "prompt": [...], "seed"?, "temperature"}]
    n = len(requests)
    pool_idx = torch.tensor(req_to_token.alloc_rows(n), dtype=torch.int64)
    seq = [0] * n

    def sampling():
        temps = torch.tensor([[r.get("temperature", 0.0)] for r in requests], dtype=torch.float32)
        return SamplingBatchInfo(
            temperatures=temps, top_ps=torch.ones(n), top_ks=torch.full((n,), -1, dtype=torch.int32),
            min_ps=torch.zeros(n), is_all_greedy=False, is_any_greedy=False, need_top_p_sampling=False,
            need_top_k_sampling=False, need_min_p_sampling=False, vocab_size=model_config.vocab_size,
            sampling_seed=torch.tensor([r.get("seed", 0) for r in requests], dtype=torch.int64))

    # Prefill (EXTEND) of every prompt.
    prompts = [r["prompt"] for r in requests]
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
    zeros = torch.zeros(n, dtype=torch.int64)
    loc = allocator.alloc_extend(zeros, zeros, lens, lens, torch.full((n,), -1, dtype=torch.int64),
                                 int(lens.sum()))
    at = 0
    for i, p in enumerate(prompts):
        req_to_token.req_to_token[pool_idx[i], :len(p)] = loc[at:at + len(p)].to(torch.int32)
        at += len(p)
        seq[i] = len(p)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND, batch_size=n,
        input_ids=torch.tensor([t for p in prompts for t in p], dtype=torch.int64), req_pool_indices=pool_idx,
        seq_lens=lens.clone(), out_cache_loc=loc, seq_lens_sum=int(lens.sum()), seq_lens_cpu=lens.clone(),
        positions=torch.cat([torch.arange(len(p)) for p in prompts]), extend_seq_lens=lens.clone(),
        extend_prefix_lens=zeros.clone(), extend_num_tokens=int(lens.sum()), sampling_info=sampling(),
        rids=[r["rid"] for r in requests])
    runner.forward(fb)

    # Decode steps: every request gets one token per step.
    for step in range(schedule["decode_steps"]):
        last = torch.tensor([int(req_to_token.req_to_token[pool_idx[i], seq[i] - 1]) for i in range(n)])
        new_lens = torch.tensor([s + 1 for s in seq], dtype=torch.int64)
        loc = allocator.alloc_decode(new_lens, new_lens.clone(), last)
        for i in range(n):
            req_to_token.req_to_token[pool_idx[i], seq[i]] = int(loc[i])
            seq[i] += 1
        tokens = torch.tensor([(7 * step + 11 * i + 3) % model_config.vocab_size for i in range(n)])
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=n, input_ids=tokens, req_pool_indices=pool_idx,
            seq_lens=new_lens.clone(), out_cache_loc=loc, seq_lens_sum=int(new_lens.sum()),
            seq_lens_cpu=new_lens.clone(), positions=new_lens - 1, sampling_info=sampling(),
            rids=[r["rid"] for r in requests])
        runner.forward(fb)
    adapter.recorder.close()
    print(json.dumps({"rank": rank, "path": adapter.recorder.path,
                      "rows": [req_to_token.req_to_token[pool_idx[i], :seq[i]].tolist() for i in range(n)],
                      "boundaries": adapter.hooks.names if adapter.hooks is not None else []}))


if __name__ == "__main__":
    model_dir, session_dir, rank, tp, port, steps = sys.argv[1:7]
    main(model_dir, session_dir, int(rank), int(tp), int(port), json.loads(steps))
