"""The token contract, end to end against a running env server (worked example in the README).

    .venv/bin/python -m env_server &            # or: docker compose up -d
    .venv/bin/python examples/token_contract.py [--address 127.0.0.1:50051] [--template qwen2_5]

Registers the offline Qwen tokenizer, opens a `python` session, sends one assistant turn as token
ids (here scripted: the ids a model would generate), and shows what the trainer appends.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tito.fingerprint import compute_fingerprint  # noqa: E402
from tito_assets.qwen_tokenizer import build_tokenizer_dir, load_tokenizer_files  # noqa: E402
from tito.v1 import environment_pb2 as pb  # noqa: E402
from tito.v1 import environment_pb2_grpc as pb_grpc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default="127.0.0.1:50051")
    ap.add_argument("--template", default="qwen2_5")
    args = ap.parse_args()

    from transformers import PreTrainedTokenizerFast

    tok_dir = build_tokenizer_dir(template=args.template)
    files = load_tokenizer_files(tok_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir, local_files_only=True)
    stub = pb_grpc.EnvironmentStub(grpc.insecure_channel(args.address))

    reg = stub.RegisterTokenizer(pb.RegisterTokenizerRequest(files=files), timeout=120)
    assert reg.fingerprint == compute_fingerprint(files, {}, reg.renderer_version), "fingerprint mismatch"
    print(f"fingerprint {reg.fingerprint[:16]}…  family {reg.template_family}  stop ids {list(reg.stop_token_ids)}")

    opened = stub.OpenSession(pb.OpenSessionRequest(
        environment="python", tokenizer_fingerprint=reg.fingerprint,
        messages=[pb.Message(role="user", content="What is 2**100?")]))
    ids = list(opened.prompt_ids)
    print(f"prompt_ids: {len(ids)} ids, ending {ids[-5:]} = {tok.decode(ids[-5:])!r}")
    try:
        # Scripted stand-in for the model's sampled ids (stop token included).
        turn = '<tool_call>\n{"name": "run_python", "arguments": {"code": "2**100"}}\n</tool_call><|im_end|>'
        completion_ids = tok.encode(turn, add_special_tokens=False)
        print(f"completion_ids: {completion_ids}")
        r = stub.Step(pb.StepRequest(session_id=opened.session_id, seq=1, completion_ids=completion_ids,
                                     max_suffix_tokens=256))
        print(f"tool message: {r.tool_messages[0].content!r}")
        print(f"suffix_ids: {list(r.suffix_ids)}")
        print(f"  = {tok.decode(list(r.suffix_ids))!r}")
        ids += completion_ids + list(r.suffix_ids)  # what the trainer holds: no re-tokenization
        print(f"trainer ids now {len(ids)} long; status {pb.StepStatus.Name(r.status)}, done {r.done}")
        print(json.dumps({"render_ms": round(r.timing.render_ms, 3), "tools_ms": round(r.timing.tools_ms, 3)}))
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=opened.session_id))
    return 0


if __name__ == "__main__":
    sys.exit(main())
