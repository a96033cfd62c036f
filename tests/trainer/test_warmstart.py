"""Warm start: demonstrations built through a real env server obey the token contract, and SFT on
them lowers the loss on teacher tokens only.

Real things: an env server subprocess with containers (the tool runs in the sandbox), the offline
Qwen tokenizer (qwen2_5 template) and the random tiny Qwen3.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math

import pytest
import torch

from tito.client import AsyncTitoClient, RecordingClient
from tito.rollout.generation import FinishReason
from tito.rollout.state import Rollout, Status
from tito.types import StepStatus
from trainer.config import WarmStartConfig, load_config
from trainer.model import build_tiny_qwen3, collate
from trainer.rollout import RolloutLimits
from trainer.tasks import ArithmeticTask, PuzzleTask, make_puzzles
from trainer.warmstart import WarmStartError, build_demonstrations, sft_backward, sft_loss, warm_start

LIMITS = RolloutLimits(budget=512, per_turn_cap=64, reserve=16, max_turns=3)


# ---------------------------------------------------------------------- no server
def test_puzzle_pool_is_deterministic_and_answers_match_the_code():
    a, b = make_puzzles(8, seed=3), make_puzzles(8, seed=3)
    assert a == b and a != make_puzzles(8, seed=4)
    assert len({p["question"] for p in a}) == 8
    for p in a:  # the locally computed answer is what the demonstrated code prints
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(p["code"], {})
        assert buf.getvalue().strip() == p["answer"], p


def test_head_estimates_are_never_the_answer_and_head_demos_skip_the_tool():
    for seed in range(20):
        for p in make_puzzles(8, seed):
            assert p["estimate"] != p["answer"], p
    task = PuzzleTask(seed=0, n=4, head_demos=2)
    specs = task.demo_specs()
    assert [s.meta["teacher"] for s in specs] == ["tool"] * 4 + ["head"] * 8
    assert len({s.group for s in specs}) == 12
    head = specs[4].meta
    assert task.teacher_turn(head, 0) == f"About {head['estimate']}.<|im_end|>"
    assert task.teacher_turn(specs[0].meta, 0).startswith("<tool_call>")
    with pytest.raises(ValueError):
        task.teacher_turn(head, 1)
    assert [s.meta["teacher"] for s in PuzzleTask(seed=0, n=4).demo_specs()] == ["tool"] * 4


def test_puzzle_sampling_covers_the_pool_and_reward_needs_a_tool_call():
    task = PuzzleTask(seed=0, n=4)
    specs = task.sample(4, step=1)
    assert sorted(s.meta["question"] for s in specs) == sorted(p["question"] for p in task.puzzles)
    assert [s.group for s in specs] == [0, 1, 2, 3]
    assert specs[0].env_args == {"expected_answer": specs[0].meta["answer"]}
    r = Rollout(budget=10)
    r.start([1, 2])
    r.append_generated([3], [-0.1], FinishReason.STOP, 4)
    r.complete(env_reward=1.0)
    assert task.reward(r, None) == 0.0  # right answer from memory, no tool call: no reward
    r.turns[0].tool_calls = 1
    assert task.reward(r, None) == 1.0
    assert PuzzleTask(n=4, require_tool_call=False).reward(
        Rollout(budget=1, status=Status.COMPLETED, env_reward=1.0), None) == 1.0


def test_arithmetic_reward_without_the_env_reads_the_final_answer(tok):
    """Without an env reward the task decodes the final turn and reads it as the env does."""
    _, tokenizer = tok

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=False)

    task = ArithmeticTask(seed=0, env_checks_answer=False)
    (spec,) = task.sample(1, step=1)
    assert spec.env_args is None
    answer = spec.meta["answer"]
    with_commas = f"{int(answer):,}"

    def reward(text):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        r = Rollout(budget=len(ids) + 2, meta=spec.meta)
        r.start([1, 2])
        r.append_generated(ids, [-0.1] * len(ids), FinishReason.STOP, len(ids))
        r.complete()
        return task.reward(r, decode)

    assert reward(f"<think>maybe 12</think>The product is {with_commas}.<|im_end|>") == 1.0
    assert reward(f"{answer} is not it, it is 12<|im_end|>") == 0.0
    assert reward("I do not know.<|im_end|>") == 0.0


def test_warm_start_config_defaults_off_and_demo_turns_it_on():
    from pathlib import Path

    assert load_config(None).warm_start.steps == 0
    demo = load_config(Path(__file__).resolve().parents[2] / "examples" / "demo.yaml")
    assert demo.warm_start.steps > 0 and demo.task.name == "puzzles"
    assert load_config(None, ["warm_start.steps=5", "warm_start.learning_rate=0.01"]).warm_start \
        == WarmStartConfig(steps=5, learning_rate=0.01)


# ---------------------------------------------------------------------- real server
async def _demos(server, files, encode, task, limits, model=None):
    client = AsyncTitoClient(server.address)
    await client.wait_ready(60)
    reg = await client.register_tokenizer(files)
    try:
        rec = RecordingClient(client)
        demos, records = await build_demonstrations(task.demo_specs(), task, encode, rec, "python",
                                                    reg.fingerprint, limits, reg.stop_token_ids, model=model)
        return demos, records, rec, reg
    finally:
        await client.close()


@pytest.fixture(scope="module")
def built(server, tok):
    files, tokenizer = tok

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False).ids

    task = PuzzleTask(seed=0, n=2, head_demos=1)
    model = build_tiny_qwen3(seed=0)
    demos, records, rec, reg = asyncio.run(_demos(server, files, encode, task, LIMITS, model))
    return task, encode, demos, records, rec, reg, model


def test_demonstrations_are_prompt_teacher_suffix_teacher(built):
    task, encode, demos, records, rec, reg, _ = built
    assert len(demos) == 4  # one tool demonstration per puzzle, then one head demonstration each
    for d, record, puzzle in zip(demos, records, task.puzzles):
        assert d.status is Status.COMPLETED and d.env_reward == 1.0 and d.tool_calls == 1
        steps = [s.result for s in rec.steps[d.session_id]]
        assert [s.status for s in steps] == [StepStatus.OK, StepStatus.EPISODE_END]
        # The tool really ran in the sandbox; the answer turn reports what it printed.
        assert steps[0].tool_messages[0].content.strip() == puzzle["answer"]
        t0 = encode(task.teacher_turn(puzzle, 0))
        t1 = encode(f"The answer is {puzzle['answer']}.<|im_end|>")
        assert t0[-1] in reg.stop_token_ids and t1[-1] in reg.stop_token_ids
        prompt, suffix = rec.prompts[d.session_id], steps[0].suffix_ids
        assert suffix and steps[1].suffix_ids == ()
        assert d.ids == [*prompt, *t0, *suffix, *t1]
        assert d.mask == [0] * len(prompt) + [1] * len(t0) + [0] * len(suffix) + [1] * len(t1)
        assert d.prompt_len == len(prompt)
        assert all(math.isfinite(x) for x, m in zip(d.logprobs, d.mask) if m == 1)
        d.check()
        assert record["teacher_turns"][1] == f"The answer is {puzzle['answer']}.<|im_end|>"
        assert record["tool_messages"] == [puzzle["answer"]]


def test_head_demonstrations_answer_at_once_and_score_zero(built):
    """A head demonstration is prompt + one teacher turn (the estimate), no tool, env reward 0."""
    task, encode, demos, records, rec, _, _ = built
    for d, record, puzzle in zip(demos[2:], records[2:], task.puzzles):
        assert d.status is Status.COMPLETED and d.tool_calls == 0 and d.env_reward == 0.0
        steps = [s.result for s in rec.steps[d.session_id]]
        assert [s.status for s in steps] == [StepStatus.EPISODE_END]
        turn = encode(f"About {puzzle['estimate']}.<|im_end|>")
        assert d.ids == [*rec.prompts[d.session_id], *turn]
        assert d.mask == [0] * d.prompt_len + [1] * len(turn)
        assert record["meta"]["teacher"] == "head" and record["tool_messages"] == []


def test_sft_loss_is_teacher_token_cross_entropy_and_decreases(built):
    _, _, demos, _, _, _, _ = built
    model = build_tiny_qwen3(seed=1)
    # The loss is the mean NLL of exactly the mask-1 tokens (checked on one demonstration
    # against full logits; the loss itself only projects mask-1 positions).
    batch = collate(demos[:1], torch.zeros(1), 0, "cpu")
    with torch.no_grad():
        loss, n = sft_loss(model, demos[:1], 0, "cpu")
        logits = model(input_ids=batch.input_ids).logits[:, :-1].float()
        nll = -torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    sel = batch.mask.bool()
    assert n == demos[0].num_generated == int(sel.sum())
    assert float(loss) == pytest.approx(float(nll[sel].mean()), rel=1e-4)
    # The tool demonstrations alone (as before head demos existed): one kind of target, so every
    # step's minibatch loss must fall; the mixed set's minibatches differ in their first tokens.
    tool_demos = [d for d in demos if d.tool_calls]
    history = warm_start(model, tool_demos, WarmStartConfig(steps=5, learning_rate=1e-2), pad_id=0,
                         device="cpu", progress=False)
    losses = [m["loss"] for m in history]
    assert [m["step"] for m in history] == list(range(1, 6))
    assert all(m["phase"] == "warm_start" for m in history)
    assert losses[-1] < losses[0] - 1.0, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_teacher_turn_longer_than_the_cap_is_refused(server, tok):
    files, tokenizer = tok

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False).ids

    tight = RolloutLimits(budget=512, per_turn_cap=12, reserve=16, max_turns=3)
    with pytest.raises(WarmStartError, match="per_turn"):
        asyncio.run(_demos(server, files, encode, PuzzleTask(seed=0, n=1), tight))


def test_sft_micro_batches_accumulate_the_same_gradient_as_one_pass(built):
    _, _, demos, _, _, _, _ = built
    batch = [d for d in demos if d.tool_calls][:3]
    grads = []
    for micro in (len(batch), 1):
        model = build_tiny_qwen3(seed=1)
        loss, n = sft_backward(model, batch, 0, "cpu", micro)
        grads.append((loss, n, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    (whole, n_whole, g_whole), (split, n_split, g_split) = grads
    assert n_whole == n_split == sum(d.num_generated for d in batch)
    assert split == pytest.approx(whole, rel=1e-5)
    assert torch.allclose(g_whole, g_split, rtol=1e-4, atol=1e-7)


def test_reasoning_gym_teacher_demonstrations_call_the_tool_and_score_one(server, tok):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is the reasoning extra")
    from trainer.reasoning_gym_task import DEMO_SEED_OFFSET
    from trainer.tasks import make_task

    files, tokenizer = tok
    task = make_task("reasoning_gym", {"dataset": "basic_arithmetic", "tools": "python", "demos": 2,
                                       "example": "examples/real_model/worked_example.json"}, seed=3, vocab_size=2)
    specs = task.demo_specs()
    # Drawn from another seed of the train split than GRPO's, each opening with the worked example's four turns.
    assert all(s.env_args["seed"] == 3 + DEMO_SEED_OFFSET and s.env_args["split"] == "train" for s in specs)
    assert [s.env_args["index"] for s in specs] == [0, 1] and len(specs[0].messages) == 5
    assert specs[0].meta["code"].startswith("print(") and task.teacher_turn(specs[0].meta, 0).startswith("<tool_call>")

    demos, records, _ = asyncio.run(_reasoning_gym_demos(server, files, specs, task, lambda stops: (
        lambda t: tokenizer.encode(t, add_special_tokens=False).ids)))
    # build_demonstrations refuses any that does not score 1.
    assert [d.env_reward for d in demos] == [1.0, 1.0] and all(d.tool_calls == 1 for d in demos)
    assert all(r["teacher_turns"][1] == f"<answer>{s.meta['answer']}</answer><|im_end|>" for r, s in zip(records, specs))
    with pytest.raises(ValueError, match="no 'expression'"):
        make_task("reasoning_gym", {"dataset": "gcd"}, seed=0, vocab_size=2).demo_specs()


async def _reasoning_gym_demos(server, files, specs, task, encoder):
    """build_demonstrations through the server; ``encoder(stop_token_ids)`` gives the teacher's encode."""
    client = AsyncTitoClient(server.address)
    await client.wait_ready(60)
    reg = await client.register_tokenizer(files)
    try:
        demos, records = await build_demonstrations(
            specs, task, encoder(reg.stop_token_ids), client, "reasoning_gym", reg.fingerprint,
            RolloutLimits(budget=1024, per_turn_cap=96, reserve=16, max_turns=3), reg.stop_token_ids)
        return demos, records, reg
    finally:
        await client.close()


def test_teacher_markup_spelled_out_in_text_tokens_is_read_as_the_same_call(server, tok):
    """warm_start.spell_out_markup: <tool_call> as the text tokens < tool _call >, as a model writes it whose row for
    the added token is untrained; the env's parser reads the call and the demonstration scores 1 as before."""
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is the reasoning extra")
    from trainer.setup import TokenizerInfo
    from trainer.tasks import make_task

    files, tokenizer = tok
    info = TokenizerInfo(files=files, vocab_size=tokenizer.get_vocab_size(), pad_id=0, eos_ids=[], _tok=tokenizer)
    end = tokenizer.token_to_id("<|im_end|>")
    added = {t for t in tokenizer.get_added_tokens_decoder()}
    text = '<tool_call>\n{"name": "run_python"}\n</tool_call><|im_end|>'
    spelled = info.encode_teacher_text(text, spell_out=True, keep=[end])
    assert spelled[-1] == end and not added & set(spelled[:-1]) and len(spelled) > len(info.encode_teacher_text(text))
    assert tokenizer.decode(spelled, skip_special_tokens=False) == text
    assert info.encode_teacher_text("x<|im_end|>y", spell_out=True, keep=[end]).count(end) == 1

    task = make_task("reasoning_gym", {"dataset": "basic_arithmetic", "tools": "python", "demos": 2},
                     seed=5, vocab_size=2)
    specs = task.demo_specs()
    demos, records, reg = asyncio.run(_reasoning_gym_demos(server, files, specs, task, lambda stops: (
        lambda t: info.encode_teacher_text(t, spell_out=True, keep=stops))))
    assert [d.env_reward for d in demos] == [1.0, 1.0] and all(d.tool_calls == 1 for d in demos)
    for d in demos:  # the teacher's tokens hold no added token but the turn ends
        taught = {i for i, m in zip(d.ids, d.mask) if m == 1}
        assert not (taught & added) - set(reg.stop_token_ids)


def test_frozen_parameters_get_no_gradient_and_no_optimizer_state(built):
    from trainer.model import freeze_parameters, trainable

    _, _, demos, _, _, _, _ = built
    model = build_tiny_qwen3(seed=1)
    total = sum(p.numel() for p in model.parameters())
    left = freeze_parameters(model, ["model.embed_tokens", "lm_head"])
    assert left == sum(p.numel() for p in trainable(model)) < total
    embed = model.get_input_embeddings().weight.detach().clone()
    warm_start(model, [d for d in demos if d.tool_calls], WarmStartConfig(steps=2, learning_rate=1e-2), pad_id=0,
               device="cpu", progress=False)
    assert torch.equal(model.get_input_embeddings().weight, embed)  # frozen: not stepped
    assert model.get_input_embeddings().weight.grad is None
    with pytest.raises(ValueError, match="no parameter of Qwen3ForCausalLM is 'model.embedding'"):
        freeze_parameters(model, ["model.embedding"])
    with pytest.raises(ValueError, match="model.freeze needs distributed.strategy: replicate"):
        load_config(None, ["model.freeze=[lm_head]", "distributed.strategy=fsdp"])
