"""The agentic rollout loop: like training/rollout/multiturn.py, but every trajectory drives a live `Episode`
(protocol.py): a turn's tool call goes to `episode.tool`, its result comes back as observation tokens (masked
from the loss), and `episode.finish` scores the whole response. An environment that crashes turns the sample
into status "env_failure" with the crash's reason (dropped by the trainer, never scored 0).

Token-in, token-out: the prompt is tokenized once, generated tokens are kept as the engine returned them, and
observations are tokenized on their own and appended."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from training.agentic.episodes import TOOL_CALL
from training.agentic.protocol import Environment, EnvironmentCrash, Episode
from training.rollout.engine import Generation, SamplingParams
from training.rollout.multiturn import observation_ids, prompt_ids
from training.rollout.trajectory import Trajectory
from training.tasks.base import Task
from training.tokenizer import END_OF_TURN, EOS

GenerateFn = Callable[[list[list[int]], SamplingParams], list[Generation]]


def response_text(traj: Trajectory) -> str:
    """All assistant text of a trajectory joined by newlines (what `Episode.finish` scores)."""
    return "\n".join(m["content"] for m in traj.messages if m["role"] == "assistant")


def _fail(traj: Trajectory, exc: BaseException) -> None:
    traj.status, traj.reason, traj.reward = "env_failure", f"{type(exc).__name__}: {exc}"[:300], 0.0


def agentic_rollout(
    generate: GenerateFn,
    tokenizer: Any,
    tasks: Sequence[Task],
    environments: dict[str, Environment],
    group_size: int,
    params: SamplingParams,
    max_turns: int = 3,
    group_prefix: str = "",
    env_threads: int = 1,
) -> list[Trajectory]:
    """`group_size` trajectories per task, one episode each, generated in one batch per turn.

    `generate` is an engine's (or the TITO gateway's) generate; `environments` maps each task's domain to an
    in-process family or a task-service client. Tool calls and finishes of one turn run on `env_threads`
    threads (environment latency is real). Every episode is closed, whatever happens."""
    stop = tuple(tokenizer.convert_tokens_to_ids(t) for t in (END_OF_TURN, EOS))
    params = replace(params, stop_token_ids=stop)
    trajs: list[Trajectory] = []
    episodes: list[Episode | None] = []
    timings: list[dict[str, float]] = []
    for ti, task in enumerate(tasks):
        ids = prompt_ids(tokenizer, task)
        for k in range(group_size):
            traj = Trajectory(
                id=f"{group_prefix}{task.id}-{k}",
                task=task.domain,
                prompt_id=task.id,
                group_id=f"{group_prefix}{ti}",
                messages=[{"role": "user", "content": task.prompt}],
                prompt_ids=ids,
            )
            trajs.append(traj)
            timings.append({"generate_s": 0.0, "environment_s": 0.0, "verify_s": 0.0})
            try:
                episodes.append(environments[task.domain].open(task))
            except EnvironmentCrash as exc:
                _fail(traj, exc)
                episodes.append(None)
    pool = ThreadPoolExecutor(max(1, env_threads), thread_name_prefix="agentic-env")
    try:
        active = [i for i, t in enumerate(trajs) if t.status == "ok"]
        for turn in range(max_turns):
            if not active:
                break
            started = time.perf_counter()
            outs = generate(
                [trajs[i].token_ids for i in active], replace(params, seed=params.seed * 1000 + turn)
            )
            elapsed = time.perf_counter() - started
            calls: dict[int, str] = {}
            for i, out in zip(active, outs, strict=True):
                traj = trajs[i]
                timings[i]["generate_s"] += elapsed
                traj.add_segment(out.token_ids, out.logprobs, out.policy_version)
                text = tokenizer.decode(out.token_ids)
                traj.messages.append({"role": "assistant", "content": text})
                call = TOOL_CALL.search(text)
                if out.finish_reason == "length":
                    traj.status, traj.reason = (
                        "truncated",
                        f"no end of turn in {params.max_new_tokens} tokens",
                    )
                elif call and turn + 1 < max_turns:
                    calls[i] = call.group(1)
            results = pool.map(lambda item: _run_tool(episodes[item[0]], item[1]), calls.items())
            for (i, _), (result, seconds) in zip(calls.items(), results, strict=True):
                timings[i]["environment_s"] += seconds
                if isinstance(result, EnvironmentCrash):
                    _fail(trajs[i], result)
                    continue
                trajs[i].messages.append({"role": "tool", "content": result})
                trajs[i].add_segment(observation_ids(tokenizer, result), None, None)
            active = [i for i in calls if trajs[i].status == "ok"]
        to_finish = [i for i, t in enumerate(trajs) if t.status != "env_failure"]
        verdicts = pool.map(lambda i: _run_finish(episodes[i], response_text(trajs[i])), to_finish)
        for i, (verdict, seconds) in zip(to_finish, verdicts, strict=True):
            traj, timings[i]["verify_s"] = trajs[i], seconds
            if isinstance(verdict, EnvironmentCrash):
                _fail(traj, verdict)
                continue
            traj.reward, traj.reward_components = verdict.reward, verdict.components()
            if traj.status == "ok":
                traj.reason = verdict.reason
    finally:
        for episode in episodes:
            if episode is not None:
                try:
                    episode.close()
                except EnvironmentCrash:
                    pass  # the episode is gone already; nothing to release
        pool.shutdown(wait=True)
    for traj, timing in zip(trajs, timings, strict=True):
        traj.timings = timing
    return trajs


def _run_tool(episode: Episode | None, payload: str) -> tuple[str | EnvironmentCrash, float]:
    started = time.perf_counter()
    try:
        return episode.tool(payload), time.perf_counter() - started  # type: ignore[union-attr]
    except EnvironmentCrash as exc:
        return exc, time.perf_counter() - started


def _run_finish(episode: Episode | None, response: str):
    started = time.perf_counter()
    try:
        return episode.finish(response), time.perf_counter() - started  # type: ignore[union-attr]
    except EnvironmentCrash as exc:
        return exc, time.perf_counter() - started


def scripted_turns(tokenizer: Any, solution: Sequence[dict[str, Any]]) -> list[list[int]]:
    """The token ids of each assistant turn of a worked solution exactly as the chat template renders them
    (content, tool calls, end of turn): what a policy that learned the solution generates, turn by turn."""
    turns = []
    for message in solution:
        if message["role"] != "assistant":
            continue
        rendered = tokenizer.apply_chat_template([message], tokenize=False)
        body = rendered.split("<|assistant|>\n", 1)[1].rstrip("\n")
        turns.append(list(tokenizer(body, add_special_tokens=False)["input_ids"]))
    return turns
