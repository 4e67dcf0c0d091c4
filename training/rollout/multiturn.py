"""The rollout loop: chat prompt -> generate to the end of the turn -> run a tool call if the turn made one and
feed its result back as an observation -> generate again, up to `max_turns`; then verify.

Token-in, token-out: the prompt is tokenized once, every generated token is kept as the engine returned it,
and observations are tokenized on their own and appended (never re-tokenizing the text of the trajectory)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from training.rollout.engine import RolloutEngine, SamplingParams
from training.rollout.trajectory import Trajectory
from training.tasks.base import Task, Verdict
from training.tokenizer import END_OF_TURN, EOS

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# A code verdict is mostly a sandboxed process starting (~30 ms): threads overlap them (measured on 2 busy
# cores: 1.6x with 2 threads, 2.0x with 4). Verifiers are task suites, safe to call from several threads.
VERIFY_THREADS = 4


def prompt_ids(tokenizer: Any, task: Task) -> list[int]:
    messages = [{"role": "user", "content": task.prompt}]
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    )


def observation_ids(tokenizer: Any, result: str) -> list[int]:
    """The end of the assistant turn's line, the tool result as an observation turn, and the next
    assistant header: exactly what the chat template renders between two assistant turns."""
    text = f"\n<|observation|>\n<tool_response>{result}</tool_response>{END_OF_TURN}\n<|assistant|>\n"
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def rollout(
    engine: RolloutEngine,
    tokenizer: Any,
    tasks: Sequence[Task],
    group_size: int,
    params: SamplingParams,
    verify: Callable[[Task, str], Verdict],
    call_tool: Callable[[str], str] | None = None,
    max_turns: int = 3,
    group_prefix: str = "",
) -> list[Trajectory]:
    """`group_size` trajectories per task, generated in one batch per turn, each verified."""
    stop = tuple(tokenizer.convert_tokens_to_ids(t) for t in (END_OF_TURN, EOS))
    params = replace(params, stop_token_ids=stop)
    trajs = []
    for ti, task in enumerate(tasks):
        ids = prompt_ids(tokenizer, task)
        for k in range(group_size):
            trajs.append(
                Trajectory(
                    id=f"{group_prefix}{task.id}-{k}",
                    task=task.domain,
                    prompt_id=task.id,
                    group_id=f"{group_prefix}{ti}",
                    messages=[{"role": "user", "content": task.prompt}],
                    prompt_ids=ids,
                )
            )
    task_of = {task.id: task for task in tasks}
    active = list(range(len(trajs)))
    gen_time = env_time = 0.0
    for turn in range(max_turns):
        if not active:
            break
        started = time.perf_counter()
        turn_params = replace(params, seed=params.seed * 1000 + turn)
        outs = engine.generate([trajs[i].token_ids for i in active], turn_params)
        gen_time += time.perf_counter() - started
        still = []
        for i, out in zip(active, outs, strict=True):
            traj = trajs[i]
            traj.add_segment(out.token_ids, out.logprobs, out.policy_version)
            text = tokenizer.decode(out.token_ids)
            call = TOOL_CALL.search(text)
            if out.finish_reason == "length":
                traj.status, traj.reason = "truncated", f"no end of turn in {params.max_new_tokens} tokens"
            elif call and call_tool is not None and turn + 1 < max_turns:
                t0 = time.perf_counter()
                result = call_tool(call.group(1))
                env_time += time.perf_counter() - t0
                traj.messages.append({"role": "assistant", "content": text})
                traj.messages.append({"role": "tool", "content": result})
                traj.add_segment(observation_ids(tokenizer, result), None, None)
                still.append(i)
                continue
            traj.messages.append({"role": "assistant", "content": text})
        active = still
    started = time.perf_counter()
    responses = ["\n".join(m["content"] for m in t.messages if m["role"] == "assistant") for t in trajs]
    with ThreadPoolExecutor(VERIFY_THREADS) as pool:
        verdicts = list(pool.map(lambda t, r: verify(task_of[t.prompt_id], r), trajs, responses))
    for traj, verdict in zip(trajs, verdicts, strict=True):
        traj.reward, traj.reward_components = verdict.reward, verdict.components()
        if traj.status == "ok":
            traj.reason = verdict.reason
    verify_time = time.perf_counter() - started
    for traj in trajs:
        traj.timings = {"generate_s": gen_time, "environment_s": env_time, "verify_s": verify_time}
    return trajs
