"""One sglang tensor-parallel rank, on the CPU, serving a schedule through
sglang's own ModelRunner, recorded by crashreplay.sglang.

Run by test_adapters_sglang_real.py, once per rank:
    python sglang_rank_child.py MODEL_DIR SESSION_DIR RANK TP PORT STEPS_JSON

Everything that runs is sglang's, as crashreplay._sglang_cpu_runner brings
up a rank (its docstring says what stands in for the Scheduler around it):
ServerArgs and their resolution, publish() of the rank, the process groups
over gloo (PyNccl and the custom all-reduce need CUDA), the model class and
its weight loaders (QKVParallelLinear, MergedColumnParallelLinear,
VocabParallelEmbedding shard and fuse the checkpoint exactly as on a GPU),
ReqToTokenPool and the paged KV allocator, and the forward itself:
TpModelWorker.forward_batch_generation - the model's layers with the
torch_native attention backend, their all-reduces between the ranks, and
sglang's sampler. Each decode step feeds every request the token sglang
sampled for it. The step schedule (requests, page size, pool sizes, decode
steps) comes from STEPS_JSON; every rank serves the same schedule, as TP
ranks do. Prints the rank's report (record_schedule's) as one JSON line.
"""
import json
import sys


def main(model_dir, session_dir, rank, tp, port, schedule):
    from crashreplay._sglang_cpu_runner import record_schedule

    server_args = dict(tp_size=tp, page_size=schedule["page_size"], random_seed=schedule["seed"],
                       max_total_tokens=schedule["max_total_tokens"],
                       max_prefill_tokens=schedule["max_prefill_tokens"],
                       cuda_graph_max_bs_decode=schedule["cuda_graph_max_bs_decode"],
                       mem_fraction_static=schedule["mem_fraction_static"], ep_size=schedule.get("ep_size", 1),
                       max_running_requests=schedule.get("max_running_requests", 8))
    report = record_schedule(model_dir, session_dir, schedule["requests"], schedule["decode_steps"], server_args,
                             fingerprints=bool(schedule.get("fingerprints")), rank=rank, port=port,
                             coredumps=bool(schedule.get("coredumps")))
    print(json.dumps(report))
    return 1 if report["failure"] else 0


if __name__ == "__main__":
    model_dir, session_dir, rank, tp, port, steps = sys.argv[1:7]
    sys.exit(main(model_dir, session_dir, int(rank), int(tp), int(port), json.loads(steps)))
