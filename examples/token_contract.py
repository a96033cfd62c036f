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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tito.client import TitoClient  # noqa: E402
from tito_assets.qwen_tokenizer import build_tokenizer_dir  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default="127.0.0.1:50051")
    ap.add_argument("--template", default="qwen2_5")
    args = ap.parse_args()

    from transformers import PreTrainedTokenizerFast

    tok_dir = build_tokenizer_dir(template=args.template)
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir, local_files_only=True)

    with TitoClient(args.address) as client:
        client.wait_ready(60)
        reg = client.register_tokenizer(tok)  # compact upload; the client checks the server's fingerprint
        print(f"fingerprint {reg.fingerprint[:16]}…  family {reg.template_family}  stop ids {list(reg.stop_token_ids)}")
        with client.open_session("python", [{"role": "user", "content": "What is 2**100?"}],
                                 fingerprint=reg.fingerprint) as session:
            ids = list(session.prompt_ids)
            print(f"prompt_ids: {len(ids)} ids, ending {ids[-5:]} = {tok.decode(ids[-5:])!r}")
            # Scripted stand-in for the model's sampled ids (stop token included).
            turn = '<tool_call>\n{"name": "run_python", "arguments": {"code": "2**100"}}\n</tool_call><|im_end|>'
            completion_ids = tok.encode(turn, add_special_tokens=False)
            print(f"completion_ids: {completion_ids}")
            r = session.step(completion_ids, max_suffix_tokens=256)
            print(f"tool message: {r.tool_messages[0].content!r}")
            print(f"suffix_ids: {list(r.suffix_ids)}")
            print(f"  = {tok.decode(list(r.suffix_ids))!r}")
            ids += completion_ids + list(r.suffix_ids)  # what the trainer holds: no re-tokenization
            print(f"trainer ids now {len(ids)} long; status {r.status.name}")
            print(json.dumps({"render_ms": round(r.timing.render_ms, 3), "tools_ms": round(r.timing.tools_ms, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
